"""The quick suite and its baselines: running ``conf/regress.yaml`` into a candidate folder
the gate owns (measuring an unsafe latency run once more), comparing it with this machine
class's baseline, and promoting a finished candidate to that baseline (``accept``)."""

from __future__ import annotations

import datetime
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TextIO

from harness.analysis.folder import analyze
from harness.provenance import cpu_flags, git_sha
from harness.regress.compare import compare_verdict, read_folder
from harness.regress.history import append_history
from harness.regress.verdict import INCOMPARABLE, NO_BASELINE, REGRESSED, ROOT, Refused, Verdict, shown
from harness.store import copy_run

#: The file ``run`` writes into a candidate folder it makes; it removes only folders holding it.
MARKER = ".regress-candidate"
#: The file ``run`` writes into its candidate once every suite command has finished: the
#: suite file, its hash and the run folders it produced. ``accept`` takes only a folder
#: holding it, unchanged since (:func:`check_candidate`).
SUITE_RECORD = ".regress-suite.json"


def hardware_class() -> str:
    """The speed-baseline class of this machine: ``gpu-<name>``, or ``cpu-amx`` /
    ``cpu-avx512`` / ``cpu-avx2`` (CPUs differ in bf16 and matmul speed, not in float32
    results)."""
    import torch

    if torch.cuda.is_available():
        return "gpu-" + torch.cuda.get_device_name(0).lower().replace(" ", "-")
    flags = (cpu_flags() or "").split()
    for flag, name in (("amx_bf16", "cpu-amx"), ("avx512f", "cpu-avx512"), ("avx2", "cpu-avx2")):
        if flag in flags:
            return name
    return "cpu-other"


SUITE = ROOT / "conf" / "regress.yaml"


def suite_commands(out: Path, suite_file: Path = SUITE) -> list[list[str]]:
    """The fixed quick suite (``conf/regress.yaml``, or another file of the same shape) as
    harness commands writing into ``out``."""
    import yaml

    if not suite_file.is_file():
        raise Refused(f"suite file {suite_file} does not exist (conf/regress*.yaml are the suites)")
    suite = yaml.safe_load(suite_file.read_text())
    return [
        [sys.executable, "-m", f"harness.{entry['module']}", *entry["args"], f"out={out}"]
        for entry in suite["commands"]
    ]


def claim_candidate(folder: Path) -> None:
    """Make ``folder`` the suite's empty candidate folder: a folder the gate made before
    (holding :data:`MARKER`) is removed and made again; an empty one is taken; anything
    else is :class:`Refused`, left as it is."""
    folder = Path(folder)
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise Refused(f"--candidate {folder} is not a folder the gate made (a file or a link); it is left alone")
    if folder.exists():
        if (folder / MARKER).is_file():
            shutil.rmtree(folder)
        elif any(folder.iterdir()):
            raise Refused(
                f"--candidate {folder} holds files the gate did not write (no {MARKER} in it); it is left alone: "
                f"give a new or empty folder, or remove it yourself"
            )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text("Made by python -m harness.regress run, which removes and remakes this folder.\n")


def run_suite(
    candidate: Path,
    baselines: Path,
    quality_tol: float,
    speed_tol: float,
    suite_file: Path = SUITE,
    baseline: Path | None = None,
    eval_speed: bool = False,
    log: TextIO | None = None,
    remeasure: int = 1,
) -> Verdict:
    """Run the suite into ``candidate`` and compare it with this machine class's baseline
    (or ``baseline``). Everything that can be refused is refused before the suite runs:
    a missing suite file or baseline folder, a corrupt baseline, a candidate folder the
    gate did not make. A latency run whose measurement is flagged unsafe is measured again
    up to ``remeasure`` times (:func:`remeasure_unsafe`), the verdict saying so. The
    suite's own output goes to ``log`` (default: this process's stdout)."""
    commands = suite_commands(candidate, suite_file)
    cls = hardware_class()
    if baseline is not None:
        base_dir = baseline / "rows" if (baseline / "rows").is_dir() else baseline
        if read_folder(base_dir, "baseline").rows.empty:  # refused now, not after the suite's minutes
            raise Refused(
                f"baseline folder {base_dir} holds no rows; give a folder of results (a candidate's, or "
                f"results/baseline/<class>/rows)"
            )
    elif not baselines.is_dir():
        raise Refused(f"baselines folder {baselines} does not exist")
    else:
        base_dir = baselines / cls / "rows"
        if base_dir.exists() and read_folder(base_dir, "baseline").rows.empty:
            raise Refused(
                f"baseline folder {base_dir} holds no rows (a broken accept?); restore it from git, or "
                f"remove it and accept a new baseline"
            )
    claim_candidate(candidate)
    wrote: dict[str, list[str]] = {}  # run folder -> the suite command that wrote it
    for cmd in commands:
        failed = _run_command(cmd, candidate, wrote, log)
        if failed:
            return Verdict(INCOMPARABLE, candidate=shown(candidate), note=failed)
    remeasured = []
    for _ in range(remeasure):
        again = remeasure_unsafe(candidate, wrote, log)
        if isinstance(again, str):  # the second measurement's command failed
            return Verdict(INCOMPARABLE, candidate=shown(candidate), note=again)
        remeasured += again
        if not again:
            break
    write_suite_record(candidate, suite_file)
    if baseline is None and not base_dir.exists():
        others = sorted(p.parent.name for p in baselines.glob("*/rows"))
        note = (
            f"NOT COMPARED: no baseline for this machine's class {cls!r} in {shown(baselines)} (have: {others}). "
            f"Accept this run as its baseline with `make regress-accept reason='first {cls} baseline'`."
        )
        if not others:
            return Verdict(NO_BASELINE, candidate=shown(candidate), note=note)
        # float32 quality is the same on every CPU: compare it with another class's baseline
        v = compare_verdict(baselines / others[0] / "rows", candidate, quality_tol, speed_tol, skip_speed=True)
        v.note = f"{note} Quality only, against {others[0]}'s baseline."
        if v.code != REGRESSED:
            v.code = NO_BASELINE
        return v
    v = compare_verdict(base_dir, candidate, quality_tol, speed_tol, eval_speed=eval_speed)
    v.remeasured = remeasured
    if baseline is None:
        v.note = f"Against the {cls} baseline."
        if v.rows:
            append_history(baselines / cls / "history.csv", v.rows, cls)
    return v


def _run_command(cmd: list[str], candidate: Path, wrote: dict[str, list[str]], log: TextIO | None) -> str:
    """Run one suite command, noting which run folders it wrote; "" or why it failed."""
    print("+", " ".join(cmd[1:]), file=log or sys.stdout, flush=True)
    before = set(run_folders(candidate))
    done = subprocess.run(cmd, cwd=ROOT, stdout=log)
    for rel in set(run_folders(candidate)) - before:
        wrote[rel] = cmd
    if done.returncode:  # a suite that cannot run gives no candidate to compare
        return f"cannot compare: the suite command `{' '.join(cmd[1:3])} ...` failed (exit {done.returncode})"
    return ""


#: Where :func:`remeasure_unsafe` keeps a first measurement it set aside (hidden: not a run
#: folder of the candidate, so neither compared nor accepted).
SET_ASIDE = ".remeasured"


def unsafe_runs(candidate: Path) -> dict[str, str]:
    """The candidate's latency run folders whose speed claims are unsafe (a failed A/A
    check, a point flagged not comparable: harness.analysis.speed), with why."""
    out = {}
    for rel in run_folders(candidate):
        a = analyze(candidate / rel)
        if a.ok("latency").empty:
            continue
        s = a.latency
        bad = s[(s["aa_ok"] == False) | (s["comparable"] == False)]  # noqa: E712  (NaN: not checked)
        if not bad.empty:
            out[rel] = "; ".join(sorted({f for f in bad["flags"] if isinstance(f, str) and f})) or "flagged unsafe"
    return out


def remeasure_unsafe(candidate: Path, wrote: dict[str, list[str]], log: TextIO | None) -> list[str] | str:
    """Measure once more every latency run of the candidate whose first measurement is
    unsafe: the run folder is set aside under ``candidate/.remeasured/<n>/`` (kept, never
    compared) and the command that wrote it runs again (it measures only what is missing).
    A failed A/A check or a speedup above its FLOP ideal says the *measurement* is not to be
    trusted (a neighbour's burst on a shared machine), not that the code changed; measuring
    again is the gate's answer, said in the verdict with the first measurement's flags, and
    a second unsafe measurement stays not comparable. Returns what was measured again, in
    words, or why its command failed."""
    unsafe = {rel: why for rel, why in unsafe_runs(candidate).items() if rel in wrote}
    if not unsafe:
        return []
    tries = sorted(int(p.name) for p in (candidate / SET_ASIDE).glob("*") if p.name.isdigit())
    aside = candidate / SET_ASIDE / str((tries[-1] + 1) if tries else 1)
    for rel in unsafe:
        dest = aside / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        (candidate / rel).rename(dest)
    for cmd in {tuple(wrote[rel]): None for rel in unsafe}:
        failed = _run_command(list(cmd), candidate, wrote, log)
        if failed:
            return failed
    return [
        f"Measured again: {rel} (its first measurement, kept in {shown(aside / rel)}, was flagged: {why})"
        for rel, why in unsafe.items()
    ]


def run_folders(folder: Path) -> list[str]:
    """The run folders under ``folder`` (those holding a ``config.yaml``, outside hidden
    folders such as Hydra's), relative, sorted."""
    found = []
    for cfg in folder.rglob("config.yaml"):
        rel = cfg.parent.relative_to(folder)
        if not any(part.startswith(".") for part in rel.parts):
            found.append(rel.as_posix())
    return sorted(found)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_suite_record(candidate: Path, suite_file: Path) -> None:
    """Written by ``run`` once every suite command has finished: which suite (its file and
    hash) produced which run folders. :func:`accept` checks the candidate against it."""
    doc = {
        "suite": str(Path(suite_file).resolve()),
        "suite_sha256": _sha256(Path(suite_file)),
        "runs": run_folders(candidate),
        "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git_sha": git_sha(),
    }
    (candidate / SUITE_RECORD).write_text(json.dumps(doc, indent=1) + "\n")


def check_candidate(candidate: Path) -> dict:
    """What ``accept`` takes, or :class:`Refused` in one line: a folder the gate made (its
    :data:`MARKER`), whose suite finished (its :data:`SUITE_RECORD`), holding the run
    folders the suite produced and no others, from a suite file unchanged since (a baseline
    must be the suite's points, or every later run compares against something else)."""
    candidate = Path(candidate)
    if not candidate.is_dir():
        raise Refused(f"candidate folder {candidate} does not exist; run make regress first")
    if not (candidate / MARKER).is_file():
        raise Refused(
            f"{candidate} is not a folder the gate made (no {MARKER} in it); only the suite's own output "
            f"(make regress) can become a baseline"
        )
    try:
        doc = json.loads((candidate / SUITE_RECORD).read_text())
        suite, sha, runs = Path(doc["suite"]), str(doc["suite_sha256"]), list(doc["runs"])
    except FileNotFoundError:
        raise Refused(
            f"{candidate}: the suite did not finish there (no {SUITE_RECORD}: a failed or killed "
            f"make regress); run it again"
        ) from None
    except (ValueError, KeyError, TypeError) as e:
        raise Refused(f"{candidate / SUITE_RECORD} is damaged ({type(e).__name__}); run make regress again") from None
    if not suite.is_file() or _sha256(suite) != sha:
        raise Refused(f"{candidate} was made by a suite that has changed since ({suite}); run make regress again")
    have = run_folders(candidate)
    if have != sorted(runs):
        extra, gone = sorted(set(have) - set(runs)), sorted(set(runs) - set(have))
        raise Refused(
            f"{candidate} no longer holds what the suite wrote (added {extra}, missing {gone}); run make regress again"
        )
    for run in runs:
        if read_folder(candidate / run, "candidate").rows.empty:
            raise Refused(f"candidate run folder {candidate / run} holds no rows; run make regress again")
    return doc


def _describe(target: Path) -> str:
    """What a baseline's rows folder holds, in a few words (what ``accept`` replaces)."""
    if not target.is_dir():
        return "no earlier baseline"
    runs = len(run_folders(target))
    return f"the earlier baseline ({runs} run folder(s), {len(analyze(target).rows)} rows)"


def accept(candidate: Path, baselines: Path, reason: str) -> None:
    """Promote the candidate's rows to this class's baseline, recording why. Only a folder
    :func:`check_candidate` takes; the new rows are written beside the old ones first and
    swapped in only once complete, so a failure midway leaves the old baseline as it was."""

    if not reason.strip():
        raise SystemExit("regress accept: give a reason (make regress-accept reason='...')")
    check_candidate(candidate)
    cls = hardware_class()
    target = baselines / cls / "rows"
    incoming, previous = target.with_name("rows.incoming"), target.with_name("rows.previous")
    for stale in (incoming, previous):
        shutil.rmtree(stale, ignore_errors=True)
    replaced = _describe(target)
    for rel in run_folders(candidate):
        copy_run(candidate / rel, incoming / rel, drop=("prediction",))
    if target.exists():
        target.rename(previous)
    incoming.rename(target)
    shutil.rmtree(previous, ignore_errors=True)
    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    with (baselines / cls / "ACCEPTED.md").open("a") as f:
        f.write(f"- {stamp} at {git_sha()}: {reason.strip()}\n")
    print(
        f"accepted {candidate} as the {cls} baseline ({target}), replacing {replaced} (git keeps it until you "
        f"commit). Nothing is committed: commit {shown(baselines / cls)}/ (rows/, ACCEPTED.md, and history.csv and "
        f"history.png, which every run appends to)."
    )
