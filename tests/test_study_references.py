"""The benchmarks that write results/reference/*.json record the commit they ran at, as a run's
rows do (harness.provenance.git_sha: the SHA, ``-dirty`` when tracked files differed from it)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import provenance
from harness.provenance import checkout_sha, git_sha
from harness.studies import ruler_generation, scoring_memory


@pytest.mark.parametrize(
    ("module", "args"),
    [
        (ruler_generation, ["--lengths", "1024", "--samples", "2", "--tasks", "niah_single_1"]),
        (scoring_memory, ["--lengths", "256"]),
    ],
    ids=["ruler_generation", "scoring_memory"],
)
def test_a_reference_benchmark_records_its_commit(module, args, tmp_path, monkeypatch):
    out = tmp_path / "out.json"
    monkeypatch.setattr(sys, "argv", ["study", *args, "--out", str(out)])
    module.main()
    written = json.loads(out.read_text())
    assert written["git_sha"] == git_sha() and re.fullmatch(r"[0-9a-f]{40}(-dirty)?", written["git_sha"]), written
    assert written["rows"] and written["hardware"] and written["versions"]


def test_a_checkout_s_commit_is_dirty_only_when_tracked_files_differ(tmp_path):
    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    (tmp_path / "a.txt").write_text("1")
    git("add", "a.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    sha = git("rev-parse", "HEAD").strip()
    assert checkout_sha(tmp_path) == sha
    (tmp_path / "new.txt").write_text("untracked")
    assert checkout_sha(tmp_path) == sha
    (tmp_path / "a.txt").write_text("2")
    assert checkout_sha(tmp_path) == sha + "-dirty"
    assert checkout_sha(tmp_path / "new.txt") == "unknown"  # not a folder git can run in


def test_the_commit_is_read_once_as_the_process_starts(monkeypatch):
    """A sweep's later points once read the checkout again, so a commit made while it ran gave
    one process's rows two SHAs (seen in the position study's rows: 81e6828 and e34d8f2 in one job)."""
    pinned = git_sha()

    def no_git(*args, **kwargs):
        raise AssertionError(f"git ran again: {args}")

    monkeypatch.setattr(provenance.subprocess, "run", no_git)
    assert git_sha() == pinned
    assert provenance.provenance(type("M", (), {"name": "m", "max_context": 8, "weights_label": "w", "dtype": "x",
                                               "speculator": None})(), "transformers")["git_sha"] == pinned  # fmt: skip


#: Tables rendered from some sample ids only (``--samples``), by folder and file name.
READINGS = {
    ("position_density_8k_qwen_cpu", "positions"): "0-19",
    ("position_density_8k_qwen_cpu", "replication"): "20-39",
    ("position_density_8k_qwen_cpu", "pooled"): "0-39",
}


@pytest.mark.parametrize(
    ("study", "folder", "table"),
    [
        ("draft_family", "draft_family_qwen_cpu", "draft_family.md"),
        ("draft_family", "draft_family_256_qwen_cpu", "draft_family.md"),
        ("lookahead", "lookahead_qwen_cpu", "lookahead.md"),
        ("lookahead", "lookahead_multikey_qwen_cpu", "lookahead.md"),
        ("positions", "positions_smollm2_cpu", "positions.md"),
        ("positions", "positions_niah_qwen_cpu", "positions.md"),
        ("positions", "chain_length_qwen_cpu", "positions.md"),
        ("positions", "positions_qa2_qwen_cpu", "positions.md"),
        ("positions", "positions_qwen_cpu", "positions.md"),
        ("positions", "position_density_qwen_cpu", "positions.md"),
        # the test on vt 0-19, the replication on 20-39 and the pooled 40 (the folder's README)
        ("positions", "position_density_8k_qwen_cpu", "positions.md"),
        ("positions", "position_density_8k_qwen_cpu", "replication.md"),
        ("positions", "position_density_8k_qwen_cpu", "pooled.md"),
    ],
)
def test_a_committed_study_table_is_what_its_rows_render(study, folder, table, tmp_path):
    """A study's committed table, the READMEs' source, re-rendered from the committed rows by the
    study's own --no-run: a change to the analysis that moves a published number shows here."""
    import importlib
    import shutil

    src = Path(__file__).resolve().parents[1] / "results" / "reference" / folder
    out = tmp_path / folder
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("*.md", "*.csv", "*.png"))
    name = table.removesuffix(".md")
    more = ["--samples", READINGS[folder, name], "--name", name] if (folder, name) in READINGS else []
    importlib.import_module(f"harness.studies.{study}").main(["--no-run", "--out", str(out), *more])
    assert (out / table).read_text() == (src / table).read_text()


@pytest.mark.parametrize(
    ("folder", "base", "name", "more"),
    [
        ("selection_grain_qwen_cpu", "chunk_size=32, keep_tokens=256, lookahead=1", "pairs", []),
        ("selection_grain_qwen_cpu", "chunk_size=32, keep_tokens=512, lookahead=1", "pairs_512", []),
        ("selection_grain_qwen_cpu", "neighbor_tokens=64", "pairs_specpc", []),
        ("selection_grain_qwen_cpu", "chunk_size=32, keep_tokens=256, lookahead=1", "pairs_fresh",
         ["--samples", "15-", "--measures", "score"]),
        ("selection_grain_qwen_cpu", "chunk_size=None, keep_tokens=256", "pairs_token",
         ["--measures", "score", "needle_kept", "needle_whole"]),
        ("selection_grain_qwen_cpu", "chunk_size=32, position_mode=original", "pairs_4k",
         ["--measures", "score", "needle_kept", "needle_whole"]),
        ("selection_grain_qwen_cpu", "chunk_size=None, position_mode=original", "pairs_positions",
         ["--measures", "score", "needle_kept", "needle_whole"]),
        ("selection_grain_qwen_cpu", "position_mode=original) (1024", "pairs_8k",
         ["--measures", "score", "needle_kept", "needle_whole", "question_kept"]),
        ("position_gaps_qwen_cpu", "gap_scale=None, max_gap=None, position_mode=original", "pairs",
         ["--measures", "score"]),
        ("position_gaps_qwen_cpu", "position_mode=contiguous", "pairs_renumbered", ["--measures", "score"]),
        ("kv_compare_smollm2_cpu", "specprefill (keep 0.1)", "pairs_specprefill_0.1", ["--measures", "score"]),
        ("kv_compare_smollm2_cpu", "specprefill (keep 0.25)", "pairs_specprefill_0.25", ["--measures", "score"]),
        ("draft_family_qwen_cpu/latency", "specprefill (512", "speed_pairs", ["--speed"]),
        ("draft_family_qwen_cpu", "specprefill (512", "pairs", ["--measures", "score", "needle_kept"]),
        ("draft_family_256_qwen_cpu/latency", "specprefill (256", "speed_pairs", ["--speed"]),
    ],
)  # fmt: skip
def test_a_committed_pairs_table_is_what_its_rows_render(folder, base, name, more, tmp_path):
    """``make pairs``'s committed tables, the folder README's source, re-rendered from the committed rows."""
    import shutil

    from harness.studies.pairs import main

    src = Path(__file__).resolve().parents[1] / "results" / "reference" / folder
    out = tmp_path / folder
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("*.md", "*.csv", "*.png"))
    main([str(out), "--base", base, "--name", name, *more])
    assert (out / f"{name}.md").read_text() == (src / f"{name}.md").read_text()


@pytest.mark.parametrize(("folder", "n"), [("positions_smollm2_cpu", 180), ("sink_check_qwen_cpu", 30)])
def test_forcing_the_first_tokens_in_changed_nothing_they_were_kept_already(folder, n):
    """The READMEs' claim that the attention sink is not what original positions lose: every line
    run with ``force_keep_first=4`` kept the same tokens (``kept_hash``) and gave the same
    predictions as the same line without it, sample for sample: the selection held the prompt's
    first four tokens already."""
    import json

    from harness.store import RunStore

    root = Path(__file__).resolve().parents[1] / "results" / "reference" / folder
    runs = [RunStore(c.parent).read() for c in root.glob("*/ruler-*/*/config.yaml")]
    key = ["length", "task", "sample_id"]

    def line(rows, first):
        opts = json.loads(rows["method_options"].iloc[0])
        return (int(rows["length"].iloc[0]), json.dumps({**opts, "force_keep_first": first}, sort_keys=True))

    without = {line(r, 0): r for r in runs if json.loads(r["method_options"].iloc[0]).get("force_keep_first") == 0}
    paired = 0
    for r in runs:
        if json.loads(r["method_options"].iloc[0]).get("force_keep_first") != 4:
            continue
        other = without[line(r, 0)].set_index(key)
        mine = r.set_index(key)
        assert len(mine) and mine.index.isin(other.index).all()
        assert (mine["kept_hash"] == other.loc[mine.index, "kept_hash"]).all()
        assert (mine["prediction"] == other.loc[mine.index, "prediction"]).all()
        paired += len(mine)
    assert paired == n


@pytest.mark.parametrize(
    ("folder", "name"),
    [
        ("position_gaps_qwen_cpu", "gaps"),
        ("position_density_qwen_cpu", "gaps_256"),
        ("position_density_qwen_cpu", "gaps_1024"),
        ("position_density_qwen_cpu", "gaps_512_fill"),
    ],
)
def test_a_committed_gap_profile_is_what_its_csv_renders(folder, name, tmp_path):
    """The gap profiles the READMEs quote (spans, empty shares), re-rendered from their committed CSVs
    by the tool's own --no-run: a change to the tables that moves a quoted number shows here."""
    import shutil

    from harness.studies.gaps import main

    src = Path(__file__).resolve().parents[1] / "results" / "reference" / folder
    shutil.copy(src / f"{name}.csv", tmp_path / f"{name}.csv")
    assert main([str(tmp_path), "--no-run", "--name", name]) == 0
    assert (tmp_path / f"{name}.md").read_text() == (src / f"{name}.md").read_text()


@pytest.mark.parametrize(
    ("folder", "sides", "across", "base", "name"),
    [
        ("reproduce_fp32_hardware", ["intel", "amd"], "hardware", "cpu: AMD EPYC", "reproduce"),
        ("reproduce_fp32_hardware", ["intel", "rerun"], "hardware", "cpu: AMD EPYC", "rerun"),
        ("dtype_default_smollm2_cpu", ["."], "dtype", "bfloat16", "reproduce"),
        ("dtype_clean_smollm2_cpu", ["."], "dtype", "bfloat16", "reproduce"),
        (
            "bf16_kernels_smollm2_cpu",
            [".", "../dtype_clean_smollm2_cpu"],
            "git_sha",
            "b9ec020b8c58429b81944ebd857ef1d85051b7d7",
            "commit",
        ),
        (
            "bf16_kernels_smollm2_cpu",
            [".", "../dtype_default_smollm2_cpu"],
            "hardware",
            "cpu: Intel(R) Xeon(R) Processor, 2 threads",
            "cpu",
        ),
        (
            "dtype_clean_smollm2_cpu",
            [".", "../dtype_default_smollm2_cpu"],
            "git_sha",
            "87e5806b2d02f7fcf0e0834b418c369b77c6e66f",
            "float32_two_machines",
        ),
        (
            "dtype_clean_smollm2_cpu",
            [".", "../dtype_default_smollm2_cpu"],
            "git_sha",
            "b9ec020b8c58429b81944ebd857ef1d85051b7d7",
            "bfloat16_two_machines",
        ),
        (
            "side_by_side_default_cpu",
            [".", "../dtype_clean_smollm2_cpu"],
            "git_sha",
            "d56c34ade3869da74c8c08575c7f20847ca38594",
            "separate_runs",
        ),
    ],
)
def test_a_committed_reproduce_table_is_what_its_rows_render(folder, sides, across, base, name, tmp_path):
    """``make reproduce``'s committed tables, the folder README's source, re-rendered from the committed rows
    (a side in another committed folder, ``../<folder>``, is read where it is)."""
    import shutil

    from harness.studies.reproduce import main

    src = Path(__file__).resolve().parents[1] / "results" / "reference" / folder
    out = tmp_path / folder
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("*.md", "*.csv", "*.png"))
    read = [str(src / s if s.startswith("../") else out / s) for s in sides]
    main([*read, "--across", across, "--base", base, "--out", str(out), "--name", name])
    assert (out / f"{name}.md").read_text() == (src / f"{name}.md").read_text()
