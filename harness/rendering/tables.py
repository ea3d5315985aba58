"""The summaries as text: markdown tables, ``value [lo, hi]`` cells, the notes under them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from harness.analysis.quality import COLUMNS as QUALITY_COLUMNS
from harness.analysis.quality import timed_loaded

#: What an eval run's TTFT ratio and speedup are, wherever one is printed.
BETWEEN_RUNS = (
    "TTFT ratio, speedup and e2e speedup here are between runs unless marked (side by side): each method's eval run "
    "timed its samples on its own, minutes apart; their interval is over samples only and does not cover the drift "
    "between runs (20 % or more on a shared machine). Side-by-side speedups: one eval job running the methods sample "
    "by sample (also=[...], the reference among them; for conversations, turn by turn), or make latency."
)
#: The columns of the quality table, in order; (value, lo, hi) cells show ``v [lo, hi]``.
SHOWN = [
    "model", "benchmark", "length", "task", "method", "keep_rate", "n", "failed", "unsupported", "score",
    "retention", "needle_kept", "kept_fraction", "ttft_s", "ttft_ratio", "speedup", "ideal_speedup",
]  # fmt: skip
#: Shown after :data:`SHOWN` where some row has a value: the KV cache after the prefill, the
#: decode time and the end-to-end speedup (rows written before they were recorded have none).
COSTS = ["kv_fraction", "kv_mib", "decode_s_per_token", "e2e_speedup"]
WITH_CI = {"score": "{:.1f}", "retention": "{:.2f}", "needle_kept": "{:.2f}", "ttft_ratio": "{:.2f}",
           "speedup": "{:.2f}x", "e2e_speedup": "{:.2f}x"}  # fmt: skip
PLAIN = {"kept_fraction": "{:.3f}", "ttft_s": "{:.2f}", "ideal_speedup": "{:.2f}x", "keep_rate": "{:g}",
         "kv_fraction": "{:.3f}", "kv_mib": "{:.1f}", "decode_s_per_token": "{:.4f}"}  # fmt: skip
#: The paired measures against the reference and the summary column counting the samples each
#: pairs (:mod:`harness.analysis.quality`): a count below the row's ``n`` is marked ``(n=K)``.
PAIRED_N = {"retention": "retention_n", "ttft_ratio": "speedup_n", "speedup": "speedup_n",
            "e2e_speedup": "e2e_speedup_n"}  # fmt: skip
assert set(SHOWN) <= set(QUALITY_COLUMNS) and set(COSTS) <= set(QUALITY_COLUMNS)
assert set(PAIRED_N.values()) <= set(QUALITY_COLUMNS)

#: What the summary's intervals are, under every rendering of it.
INTERVAL_NOTE = ("Score, retention (score / the reference's, same samples), needle kept, TTFT ratio and speedup: "
                 "value [95 % bootstrap interval over samples, seeded; the same estimator as the value]. "
                 f"{BETWEEN_RUNS} "
                 "Ideal speedup: the FLOP model's full prefill over the method's work (its speculator "
                 "included); \"above ideal\": a speedup beyond it by more than the tolerance (10 % where the ideal "
                 "is 1.0, else 15 %), an anomaly to explain, not a finding.")  # fmt: skip
COSTS_NOTE = ("kv_fraction: the base's KV cache after the prefill over the prompt (tokens); kv_mib: the KV "
              "memory held, all layers: the base's cache plus any the method keeps beside it (KV revival's "
              "speculator cache); decode_s_per_token: decode time over output tokens; e2e_speedup: the reference's "
              "TTFT + decode of the benchmark's output length over the method's, same samples, same machine "
              "[95 % interval].")  # fmt: skip
LOADED_NOTE = (
    "(loaded): some sample of the point or of its reference ran while other work used the machine (more than 10 % "
    "of the job's cores, or a 1-minute load average above the cores + 0.5: the rows' foreign_cpu, loadavg_1m), "
    "so its speedup times that work as much as the methods; time it again alone, or side by side (make latency)."
)
FEWER_NOTE = (
    "Retention, TTFT ratio, speedup or e2e speedup `(n=K)`: the measure over the reference's on the K samples both ran, fewer "
    "than the row's n (the reference ran fewer samples, or failed some); its interval is over those K."
)
UNPAIRED_NOTE = (
    "TTFT ratio `-` with a TTFT: no rows of the reference method for that task with the same dtype and "
    "backend ran on the same machine (the rows' `hardware` and CPU flags), so no side-by-side ratio exists."
)


def md_table(df: pd.DataFrame) -> str:
    """``df``'s cells, as they are (``str``), as a markdown table."""
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def with_ci(v: float, lo: float, hi: float, fmt: str) -> str:
    """``v [lo, hi]`` (``-`` without a value, ``v`` alone without an interval)."""
    if pd.isna(v):
        return "-"
    if pd.isna(lo) or pd.isna(hi):
        return fmt.format(v)
    return f"{fmt.format(v)} [{fmt.format(lo)}, {fmt.format(hi)}]"


def ci(v: float, lo: float, hi: float, f: str = ".1f") -> str:
    """:func:`with_ci` with a format spec (``".2f"``): ``v [lo, hi]``, ``-`` without a value,
    ``v (no interval)`` where the analysis gave none (too few pairs, an older protocol)."""
    if not pd.isna(v) and (pd.isna(lo) or pd.isna(hi)):
        return f"{v:{f}} (no interval)"
    return with_ci(v, lo, hi, "{:" + f + "}")


def fewer(n: Any, paired: Any) -> str:
    """`` (n=K)`` where a paired measure rests on fewer samples (``paired``, K > 0) than its
    row's ``n`` (the reference ran fewer, or failed some), ``""`` otherwise (none paired: the
    measure has no value, its cell says ``-``)."""
    return f" (n={int(paired)})" if not pd.isna(paired) and not pd.isna(n) and 0 < int(paired) < int(n) else ""


def short_paired(summary: pd.DataFrame, measures: tuple[str, ...] = tuple(PAIRED_N)) -> bool:
    """Whether some row's paired measure among ``measures`` (:data:`PAIRED_N`'s keys) pairs fewer
    samples than its ``n`` (:func:`fewer`)."""
    counts = {PAIRED_N[m] for m in measures} & set(summary.columns)
    return any(any(map(fewer, summary["n"], summary[k])) for k in sorted(counts))


def num(v: float, f: str) -> str:
    """``v`` in format spec ``f``, ``-`` without a value."""
    return "-" if pd.isna(v) else f"{v:{f}}"


def difference(v: float, lo: float, hi: float) -> str:
    """A paired difference in points with its interval, ``(within noise)`` where it holds 0."""
    null = "" if pd.isna(lo) or lo > 0 or hi < 0 else " (within noise)"
    return f"{v:+.1f} [{lo:+.1f}, {hi:+.1f}]{null}"


def format_summary(summary: pd.DataFrame, columns: list[str] | None = None) -> pd.DataFrame:
    """The summary's cells as text, :data:`SHOWN` columns (and each of :data:`COSTS` some row
    has): the measures with an interval as ``value [lo, hi]`` (95 %), the others rounded,
    ``-`` where a value is missing."""
    if columns is None:
        columns = SHOWN + [c for c in COSTS if c in summary and summary[c].notna().any()]
    s = pd.DataFrame(index=summary.index)
    for c in columns:
        if c in WITH_CI:
            s[c] = [with_ci(v, lo, hi, WITH_CI[c]) for v, lo, hi in
                    zip(summary[c], summary[f"{c}_lo"], summary[f"{c}_hi"], strict=True)]  # fmt: skip
            if PAIRED_N.get(c) in summary:
                s[c] = [v + fewer(n, k) for v, n, k in zip(s[c], summary["n"], summary[PAIRED_N[c]], strict=True)]
            if c == "speedup" and "speedup_timing" in summary:
                paired = summary["speedup_timing"].fillna("").astype(str).str.startswith("side by side")
                s.loc[paired, c] = s.loc[paired, c] + " (side by side)"
                busy = loaded(summary)
                s.loc[busy, c] = s.loc[busy, c] + " (loaded)"
            if c == "speedup" and "speed_anomaly" in summary:
                above = summary["speed_anomaly"].fillna("").astype(str) != ""
                s.loc[above, c] = s.loc[above, c] + " (above ideal)"
        elif c in PLAIN:
            s[c] = summary[c].map(lambda v, f=PLAIN[c]: "-" if pd.isna(v) else f.format(v))
        else:
            s[c] = summary[c]
    return s


def loaded(summary: pd.DataFrame) -> pd.Series:
    """Which rows' speedups were timed on a loaded machine (``speedup_timing`` ends ``loaded``)."""
    if "speedup_timing" not in summary:
        return pd.Series(False, index=summary.index)
    return summary["speedup_timing"].map(timed_loaded).astype(bool)


def unpaired(summary: pd.DataFrame) -> bool:
    """Whether some row has a TTFT but no side-by-side ratio to its reference."""
    return bool((summary["ttft_s"].notna() & summary["ttft_ratio"].isna()).any())


def to_markdown(summary: pd.DataFrame) -> str:
    """The summary as markdown with its intervals and ``n``."""
    if summary.empty:
        return "(no results)\n"
    table = format_summary(summary)
    lines = [md_table(table).rstrip("\n"), "", INTERVAL_NOTE]
    if "kv_fraction" in table:
        lines += ["", COSTS_NOTE]
    if short_paired(summary):
        lines += ["", FEWER_NOTE]
    if unpaired(summary):
        lines += ["", UNPAIRED_NOTE]
    if loaded(summary).any():
        lines += ["", LOADED_NOTE]
    return "\n".join(lines) + "\n"


POINT = ["model", "benchmark", "length", "method", "keep_rate"]


def score_by_task(summary: pd.DataFrame) -> pd.DataFrame:
    """The score column of ``summary`` pivoted: one row per model, benchmark, length,
    method and keep rate; one column per task, then the category means, then ``ALL``
    (length-bucket rows are left to the long table). A cell reads ``-`` where the point
    has no score for that task, and carries ``(n=K)`` where it averages fewer samples
    than the fullest point in its column (a partial or failing run)."""
    s = summary[~summary["task"].str.contains(" @", regex=False)]
    if s.empty:
        return pd.DataFrame(columns=POINT)
    names = set(s["task"])
    tasks = sorted(t for t in names if t != "ALL" and not t.startswith("["))
    order = [*tasks, *sorted(t for t in names if t.startswith("[")), *(["ALL"] if "ALL" in names else [])]
    most = s.groupby(["model", "benchmark", "length", "task"])["n"].transform("max")

    def cell(score: float, n: int, top: int) -> str:
        if pd.isna(score):
            return "-"
        return f"{score:.1f}" + (f" (n={n})" if n < top else "")

    s = s.assign(_cell=[cell(a, b, c) for a, b, c in zip(s["score"], s["n"], most, strict=True)])
    wide = s.pivot_table(index=POINT, columns="task", values="_cell", aggfunc="first")
    wide = wide.reindex(columns=order).fillna("-").reset_index()
    wide.columns.name = None
    return wide


def by_task_markdown(summary: pd.DataFrame) -> str:
    """``score_by_task`` as a markdown table; empty where there is one task or none."""
    wide = score_by_task(summary)
    if len([c for c in wide.columns if c not in (*POINT, "ALL")]) < 2:
        return ""
    wide["keep_rate"] = wide["keep_rate"].map(lambda v: "-" if pd.isna(v) else f"{v:g}")
    return md_table(wide)


#: The latency table's columns, in order (:func:`format_latency`); the speedups with their
#: interval as ``v [lo, hi]``; ``check`` says in a word what :func:`latency_notes` says in full.
LATENCY_SHOWN = [
    "model", "backend", "dtype", "prompt_source", "batch", "length", "method", "keep_rate", "pairs", "ttft_median_s",
    "method_median_s", "speedup", "ideal_speedup", "efficiency", "ideal_engine_speedup", "aa_speedup", "foreign_cpu",
    "kv_mib",
    "decode_s_per_token", "decode_speedup", "e2e_speedup", "energy_j_per_request", "energy_ratio", "check",
]  # fmt: skip
LATENCY_CI = {"speedup": "{:.2f}x", "aa_speedup": "{:.3f}x", "e2e_speedup": "{:.2f}x", "decode_speedup": "{:.2f}x",
              "energy_ratio": "{:.2f}x"}  # fmt: skip
LATENCY_PLAIN = {"keep_rate": "{:g}", "pairs": "{:.0f}", "ttft_median_s": "{:.3f}", "method_median_s": "{:.3f}",
                 "ideal_speedup": "{:.2f}x", "efficiency": "{:.2f}", "ideal_engine_speedup": "{:.2f}x", "foreign_cpu": "{:.0%}", "kv_mib": "{:.1f}",
                 "decode_s_per_token": "{:.4f}", "energy_j_per_request": "{:.3g}"}  # fmt: skip
#: The protocol under every latency table (what its numbers are).
LATENCY_NOTE = (
    "Speedup: the reference's TTFT over the method's, timed side by side in one run on the same prompts, the "
    "order of the methods turned over every iteration; value = median over the timed pairs, [95 % bootstrap "
    "interval over pairs]; no interval under 5 pairs. aa_speedup: the reference timed against itself the same way "
    "(the A/A check; it must hold 1.0; its own line, at a point timed in several runs, shows the run farthest "
    "from 1.0, and each method's line its own run's check). Ideal: the FLOP model's full prefill over the "
    "method's work (its speculator included); efficiency = speedup / ideal. ideal_engine_speedup (where the speculator runs on "
    "another engine than the base): the same work at each engine's measured FLOP rate at the point. decode_speedup "
    "(where tokens were decoded after each prefill): the reference's time per output token over the method's, "
    "paired the same way. energy_j_per_request (where the hardware counts energy): joules over the TTFT window per "
    "request, median; energy_ratio: the reference's joules over the method's, paired the same way (above 1: the "
    "method uses less). foreign_cpu: the most of the cores other processes used "
    "while a row of the point was timed. check: ok, or what makes the speed claim unsafe (notes below)."
)  # fmt: skip
CHECK_WORDS = (("anomaly", "ANOMALY"), ("A/A check failed", "A/A FAILED"), ("too few pairs", "few pairs"),
               ("order not balanced", "old protocol"), ("no warm-up", "no warm-up"), ("loaded", "loaded"))  # fmt: skip


def flag_word(flags: object) -> str:
    text = flags if isinstance(flags, str) else ""
    words = [short for key, short in CHECK_WORDS if key in text]
    return ", ".join(words) if words else "ok"


def format_latency(lat: pd.DataFrame) -> pd.DataFrame:
    """The latency summary's cells as text (:data:`LATENCY_SHOWN`; the decode columns only
    where some row decoded)."""
    cols = [c for c in LATENCY_SHOWN if c == "check" or c in lat]
    if not (lat.get("decode_s_per_token", pd.Series(dtype=float)).notna().any()):
        cols = [c for c in cols if c not in ("decode_s_per_token", "decode_speedup", "e2e_speedup")]
    for c in ("aa_speedup", "ideal_engine_speedup", "energy_j_per_request", "energy_ratio"):  # where some row has one
        if not lat.get(c, pd.Series(dtype=float)).notna().any():
            cols = [x for x in cols if x != c]
    s = pd.DataFrame(index=lat.index)
    for c in cols:
        if c == "check":
            s[c] = [("-" if ref else flag_word(f)) for f, ref in zip(lat["flags"], lat["is_reference"], strict=True)]
        elif c in LATENCY_CI:
            s[c] = [with_ci(v, lo, hi, LATENCY_CI[c]) for v, lo, hi in
                    zip(lat[c], lat[f"{c}_lo"], lat[f"{c}_hi"], strict=True)]  # fmt: skip
        elif c in LATENCY_PLAIN:
            s[c] = lat[c].map(lambda v, f=LATENCY_PLAIN[c]: "-" if pd.isna(v) else f.format(v))
        else:
            s[c] = lat[c]
    return s


def latency_notes(lat: pd.DataFrame) -> list[str]:
    """One line per flagged point: its label and every flag in words."""
    out = []
    for _, r in lat.iterrows():
        if isinstance(r.get("flags"), str) and r["flags"]:
            keep = "" if pd.isna(r.get("keep_rate")) else f" keep {r['keep_rate']:g}"
            out.append(
                f"{r['method']}{keep} at {int(r['batch'])}x{int(r['length'])} ({r['prompt_source']}): {r['flags']}"
            )
    return out


def energy_line(lat: pd.DataFrame) -> str:
    """What the energy columns read (their sources), or why they are empty."""
    sources = sorted(set(lat["energy_source"].dropna().astype(str))) if "energy_source" in lat else []
    return f"Energy: {'; '.join(sources)}." if sources else ""


def decode_notes(lat: pd.DataFrame) -> list[str]:
    """One line per point whose decode after the prefill is slower than the reference's: the
    paired per-token ratio's interval lies below 1 (``decode_speedup``: the reference's time per
    output token over the method's, iteration by iteration), by how much."""
    if "decode_speedup_hi" not in lat:
        return []
    out = []
    for _, r in lat[~lat["is_reference"].astype(bool)].iterrows():
        hi = r.get("decode_speedup_hi")
        if pd.notna(hi) and hi < 1.0:
            keep = "" if pd.isna(r.get("keep_rate")) else f" keep {r['keep_rate']:g}"
            out.append(
                f"{r['method']}{keep} at {int(r['batch'])}x{int(r['length'])}: decodes slower than {r['reference']} "
                f"after its prefill, {1 / r['decode_speedup'] - 1:.0%} more time per output token "
                f"({r['decode_s_per_token']:.4f} s; decode speedup {r['decode_speedup']:.2f}x "
                f"[{r['decode_speedup_lo']:.2f}, {r['decode_speedup_hi']:.2f}])"
            )
    return out


def latency_markdown(lat: pd.DataFrame) -> str:
    """The latency summary as markdown: the table, the protocol's note, every flagged point."""
    if lat.empty:
        return "(no results)\n"
    lines = [md_table(format_latency(lat)).rstrip("\n"), "", LATENCY_NOTE]
    notes = latency_notes(lat)
    if notes:
        lines += ["", "Flagged points:", "", *(f"* {n}" for n in notes)]
    energy = energy_line(lat)
    if energy:
        lines += ["", energy]
    slower = decode_notes(lat)
    if slower:
        lines += ["", "Decoding after the prefill:", "", *(f"* {n}" for n in slower)]
    from harness.analysis.speed import break_even

    be = break_even(lat)
    if not be.empty:
        lines += ["", "Break-even:", "", *(f"* {line}" for line in break_even_lines(be))]
    return "\n".join(lines) + "\n"


def _tokens(n: float, how: str, lengths: list[int]) -> str:
    if how == "not reached":
        return f"not reached up to {max(lengths):,} tokens"
    if how == "at or below":
        return f"at or below {int(n):,} tokens (the shortest length measured)"
    below = max(x for x in lengths if x < n) if any(x < n for x in lengths) else min(lengths)
    above = min(x for x in lengths if x >= n)
    return f"at ~{n:,.0f} tokens (interpolated on log2 length between {below:,} and {above:,})"


def break_even_lines(be: pd.DataFrame) -> list[str]:
    """One line per method and keep: the shortest prompt length at which the measured
    speedup's 95 % interval lies above 1 (:func:`harness.analysis.speed.break_even`), and
    the FLOP model's."""
    out = []
    for r in be.itertuples():
        keep = "" if pd.isna(r.keep_rate) else f" at keep {float(r.keep_rate):g}"
        line = (
            f"{r.method}{keep} ({r.model}, {r.backend}, {r.dtype}, prompts {r.prompt_source}, batch {r.batch}): "
            f"break-even "
            f"{_tokens(r.break_even_tokens, r.break_even_how, r.lengths)}, the first length where its speedup's 95 % "
            f"interval lies above 1; the FLOP model's ideal: "
            f"{_tokens(r.ideal_break_even_tokens, r.ideal_break_even_how, r.lengths)}"
        )
        if r.regresses:
            line += "; a longer point falls back to 1 or below (not monotone: read the table)"
        out.append(line + ".")
    return out


def numbers_md(df: pd.DataFrame) -> str:
    """A latency or serving summary as markdown, floats to three decimals."""
    if df.empty:
        return "(no results)\n"
    return md_table(df.astype(object).map(lambda v: f"{v:.3f}" if isinstance(v, float) else v))


#: The committed depth sweep of the early-exit speculator (``make speculator-depth``): its
#: table, and the numbers the summary quotes from it.
DEPTH_SWEEP = "results/reference/speculator_depth_smollm2_cpu.md"
DEPTH_SWEEP_CSV = "results/reference/speculator_depth_smollm2_cpu.csv"
DEPTH_SWEEP_MODEL = "smollm2-135m"


def natural_key(label: object) -> list:
    """A sort key that puts 'self_layers:8' before 'self_layers:12'."""
    import re

    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(label))]


def _depth_numbers(specs: list[str], csv: Path) -> str:
    """What the committed sweep measured at keep 0.1 for these depths and for the oracle."""
    if not csv.exists():
        return ""
    d = pd.read_csv(csv)
    d = d[(d["method"] == "specprefill") & (d["keep"] == 0.1)]
    if d.empty:
        return ""
    d = d.set_index(d["depth"].map(lambda m: f"self_layers:{int(m)}"))
    col = "lat_speedup" if "lat_speedup" in d and d["lat_speedup"].notna().any() else "speedup"
    top = f"self_layers:{int(d['depth'].max())}"
    parts = []
    for spec in dict.fromkeys([*specs, top]):  # these depths, then the oracle
        if spec in d.index:
            r = d.loc[spec]
            oracle = " (the oracle: all layers)" if spec == top else ""
            parts.append(f"{spec}{oracle} keeps {r['retention']:.2f} of full prefill's score at {r[col]:.2f}x")
    return f" At keep 0.1 it measured: {'; '.join(parts)}." if parts else ""


def speculator_note(rows: pd.DataFrame, csv: Path | None = None) -> str | None:
    """A line under the quality table when SpecPrefill ran with an early-exit speculator
    (``self_layers:M``, the offline stand-in for the paper's separate small model): where
    its loss at low keep rates comes from, where the depth sweep is and, for the sweep's
    model, what it measured for these depths and for the oracle."""
    if rows.empty or "speculator" not in rows:
        return None
    ev = rows[(rows["kind"] == "eval") & (rows["method"] == "specprefill")]
    specs = sorted({str(s) for s in ev["speculator"].dropna() if str(s).startswith("self_layers:")}, key=natural_key)
    if not specs:
        return None
    numbers = ""
    if set(ev["model"].dropna().astype(str)) == {DEPTH_SWEEP_MODEL}:
        numbers = _depth_numbers(specs, csv or Path(__file__).resolve().parents[2] / DEPTH_SWEEP_CSV)
    return (
        f"SpecPrefill's speculator here is the base model's own first layers ({', '.join(specs)}: an early "
        f"exit, the offline stand-in for the paper's separate small speculator). On three needle tasks most of "
        f"its loss at low keep rates comes from that weak scorer, not from the method: `{DEPTH_SWEEP}` measures "
        f"every depth up to the oracle (all layers: full prefill's quality, no speedup); other tasks were not "
        f"measured so.{numbers}\n"
    )
