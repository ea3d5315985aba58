"""Rows as every reader sees them: normalized once, when they are read.

:func:`normalize` is the one place that

* gives the reference its keep rate (:data:`REFERENCE_KEEP`: the reference prefills every
  token; its rows store none), and so a run with a budget in tokens (``keep_tokens``: no
  fraction), whose label then names the budget;
* blanks the reference's speculator (it runs none, so its point is the same whatever the
  model's speculator is);
* fills the optional columns (``""`` where a row kind or an older row has none);
* adds ``machine``: what a row ran on, its ``hardware`` with its ``cpu_flags`` in brackets
  where it recorded them (:func:`machine`), the one test of "the same machine" (two CPUs of
  one model name but other kernels are two machines; a row without flags matches only rows
  without them);
* adds ``kv_held_bytes``: the base's KV cache plus any cache the method keeps beside it
  (``speculator_kv_bytes``, KV revival's speculator cache; 0 where a row has none, unknown
  (NaN) for a policy of :data:`SECOND_CACHE_POLICIES` whose row predates the column);
* makes each turn of a conversation (a multi-turn benchmark's rows carry ``turn``) a task
  of its own, ``<task>/turn<k>``: every measure is then taken per turn, paired with the
  reference's same turn of the same conversation, and ``ALL`` is the mean over turns;
* marks the reference's rows (``is_reference``) and labels each run (``label``: the method's
  name plus the options that tell apart runs that would otherwise share a point,
  :func:`label_variants`).

A point is one value of :data:`POINT` (the same key in the summary, the gate and the paper
tables); latency points add the grid (:data:`LATENCY_POINT`). The columns each reader needs
are here too (:data:`GATE_COLUMNS`, :data:`PAPER_POINT_COLUMNS`).
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

#: The reference's keep rate: it prefills the whole prompt.
REFERENCE_KEEP = 1.0
#: The ``method`` of a latency job's A/A check: the reference itself, timed a second time on
#: the same prompts as a method beside it (its options are the reference's); its speedup
#: must read 1.0 (:mod:`harness.analysis.speed`).
AA_METHOD = "aa_check"
#: Multi-turn policies that keep the speculator's cache of the whole conversation beside the
#: base's (``specprefill/conversation.py``: KV revival), recorded as ``speculator_kv_bytes``.
SECOND_CACHE_POLICIES = ("revival",)
#: What identifies a point of eval rows: a method with its options at a keep rate, on a
#: model (and speculator), benchmark (and its options) and length, in a dtype and backend,
#: compared with one reference method.
POINT = [
    "model", "speculator", "benchmark", "benchmark_options", "length", "method", "method_options", "keep_rate",
    "dtype", "backend", "reference_method",
]  # fmt: skip
#: A latency point: the grid point and the prompts instead of the benchmark.
LATENCY_POINT = [
    "model", "speculator", "backend", "dtype", "prompt_source", "batch", "length", "method", "method_options",
    "keep_rate", "reference_method",
]  # fmt: skip
#: The point key without the method: the reference a point's ratios are taken against.
REFERENCE_OF = ["model", "benchmark", "benchmark_options", "length", "dtype", "backend", "reference_method"]
#: Columns the regression gate reads, by row kind: a folder lacking one is refused, naming it
#: (harness.regress.compare.read_folder).
GATE_COLUMNS = {
    "": ("kind", "status", "model", "method", "method_options", "keep_rate", "reference_method", "run_id"),
    "eval": ("benchmark", "length", "task", "sample_id", "score", "ttft_s", "hardware"),
    "latency": ("backend", "prompt_source", "batch", "length", "warmup", "ttft_s"),
}
#: The serving settings every qps row records (the columns; what each is in conf/qps.yaml, and
#: how they are matched: harness.analysis.serving.SETTINGS).
QPS_SETTING_COLUMNS = ("timeout_s", "max_timeouts", "ttft_p90_slo_s", "warmup_requests", "arrival_seed")
#: The paper tables' point files (``results/paper/<table>/<variant>/rows.csv``): what the
#: tables read, :class:`harness.paper.numbers.Ours` (lookups, provenance, why a cell is empty),
#: :mod:`harness.analysis`'s latency and serving summaries; ``sub`` is the command's
#: subfolder (one per QPS category). tests/test_paper.py renders from these columns alone
#: and from whole rows and compares.
PAPER_POINT_COLUMNS = (
    "sub", "kind", "run_id", "config_hash", "status", "error", "git_sha", "hardware", "model", "speculator",
    "dtype", "backend", "method", "method_options", "reference_method", "keep_rate",
    "benchmark", "benchmark_options", "length", "task", "category", "sample_id", "score", "ttft_s",
    "prompt_source", "batch", "iteration", "warmup", "kept_fraction", "method_s", "base_prefill_s", "ideal_speedup",
    "arrival", "rate", "request", "prompt_tokens", "kept_tokens", "timed_out", "e2e_s", "tpot_s", "speculator_s",
    "pass_timeout_rule", "pass_ttft_slo", "passed", "request_throughput", "start_time",
    "order", "foreign_cpu", "loadavg_1m", "cpus",  # the paired protocol's: pair order and the load while timed
    *QPS_SETTING_COLUMNS,  # a max QPS is compared only with the reference's under the same settings
)  # fmt: skip
#: The point files' text columns, read back as text (a git SHA of digits alone stays a SHA).
PAPER_TEXT_COLUMNS = (
    "sub", "kind", "run_id", "config_hash", "status", "error", "git_sha", "hardware", "model", "speculator",
    "dtype", "backend", "method", "method_options", "reference_method", "benchmark", "benchmark_options", "task",
    "category", "prompt_source", "arrival",
)  # fmt: skip
#: Text columns a row may lack (a kind without them, an older row): ``""`` there.
OPTIONAL_TEXT = (
    "speculator", "benchmark", "benchmark_options", "method_options", "dtype", "backend", "category", "bucket",
    "hardware", "prompt_source",
)  # fmt: skip
#: Run fields that tell apart otherwise equal runs in a label.
RUN_KEYS = ("dtype", "backend", "speculator")
#: Point fields a table does not show as columns: a label names them where runs differ.
LABELLED = ("speculator", "benchmark_options", "method_options", "dtype", "backend")
#: A model's settings that change its results under one name (rows record them; older rows
#: lack them): a point must not pool runs that differ in one, which a label cannot tell apart
#: (:func:`require_one_model`). ``model_seed`` counts only for random weights.
MODEL_SETTINGS = ("model_weights", "weights_hash", "chat_template", "model_revision", "model_path", "model_seed")
#: Marks a normalized frame (normalizing twice is a no-op).
NORMALIZED = "is_reference"


def _options(v: Any) -> dict[str, Any]:
    """A stored options column as a dict (``{}`` where the row has none)."""
    return json.loads(v) if isinstance(v, str) and v else {}


def label_variants(df: pd.DataFrame, point: list[str]) -> pd.Series:
    """A label per row: the method name, plus the options that tell apart runs which
    would otherwise share a row of a table keyed by ``point`` without them (look-ahead,
    pooling, truncation, output cap, speculator, dtype, ...)."""
    labels = df["method"].astype(str).copy()
    # a variant: a run, and within one run a method's options (a latency job times variants of
    # one method side by side, ``also``: one run, one config_hash)
    by = [c for c in ("config_hash", "method_options") if c in df]
    for _, g in df.groupby(point, dropna=False):
        variant = g[by].astype(str).agg("\x1f".join, axis=1) if by else pd.Series("", index=g.index)
        runs = g.loc[~variant.duplicated()]
        if len(runs) < 2:
            continue
        opts = {
            v: {
                **_options(r.get("method_options")),
                **_options(r.get("benchmark_options")),
                **{k: r.get(k) for k in RUN_KEYS},
            }
            for v, r in zip(variant[runs.index], runs.to_dict("records"), strict=True)
        }
        differ = sorted({k for o in opts.values() for k in o if len({json.dumps(x.get(k)) for x in opts.values()}) > 1})
        for v, o in opts.items():
            desc = ", ".join(f"{k}={o.get(k)}" for k in differ if k != "keep_rate")
            if desc:
                labels[g.index[variant == v]] = f"{g['method'].iloc[0]} ({desc})"
    return labels


def _setting(df: pd.DataFrame, column: str) -> pd.Series:
    """One of :data:`MODEL_SETTINGS` as text, ``""`` where a row does not record it (an older
    row, a kind without it; a seed of real weights)."""
    v = df[column].astype(object).where(df[column].notna(), "").astype(str)
    if column == "model_seed" and "model_weights" in df:
        v = v.where(df["model_weights"].fillna("").astype(str).str.startswith("random"), "")
    return v.replace({"None": "", "nan": ""})


def require_one_model(df: pd.DataFrame, key: list[str]) -> None:
    """Refuse (:class:`~harness.failures.MixedModels`, one line) rows that share ``key`` but
    hold runs of one model under different :data:`MODEL_SETTINGS`: the readers would pool
    them (one run's samples kept as the other's duplicates) or take one's ratios against the
    other's reference. Eval and serving rows are checked by their reference's key
    (:data:`REFERENCE_OF`: a method and the reference it is compared with), latency rows by
    point and label. A setting a row does not record does not count."""
    from harness.failures import MixedModels

    have = [c for c in MODEL_SETTINGS if c in df]
    if not have:
        return
    settings = pd.DataFrame({c: _setting(df, c) for c in have}, index=df.index)
    for _, g in df.groupby(key, dropna=False, sort=False):
        for c in have:
            values = sorted({v for v in settings.loc[g.index, c] if v})
            if len(values) > 1:
                run = g["run_id"].astype(str) if "run_id" in g else pd.Series("?", index=g.index)
                at = settings.loc[g.index, c]
                seen = "; ".join(f"{c}={v} (runs {', '.join(sorted(set(run[at == v]))[:2])})" for v in values)
                raise MixedModels(
                    f"model {g['model'].iloc[0]}: runs compared or pooled together ran it with different settings "
                    f"that change results, {seen}; allowed: one setting a folder (write each to its own out=), or a "
                    "model config of its own name for each"
                )


def machine(rows: pd.DataFrame) -> pd.Series:
    """What each row ran on: its ``hardware``, with its ``cpu_flags`` (the CPU features that
    pick the kernels, :func:`harness.provenance.cpu_flags`) in brackets where it recorded
    them; ``""`` where a row records no hardware."""
    hw = rows["hardware"] if "hardware" in rows else pd.Series(None, index=rows.index, dtype=object)
    flags = rows["cpu_flags"] if "cpu_flags" in rows else pd.Series(None, index=rows.index, dtype=object)
    return pd.Series(
        [
            "" if pd.isna(h) else f"{h} [{f}]" if isinstance(f, str) and f else str(h)
            for h, f in zip(hw, flags, strict=True)
        ],
        index=rows.index,
        dtype=object,
    )


def keep_lines(rows: pd.DataFrame, setup: list[str]) -> pd.Series:
    """Each normalized row's line: its label (the method and the options that tell its runs
    apart), and its keep rate where the label ran at more than one in a ``setup`` (the columns
    within which lines are set against each other). A label leaves the keep out (the summary's
    tables have a column for it), so ``make eval keep=0.1,0.3,0.5`` gives three runs one label;
    taken as one line, their rows would be paired as if they were one run's."""
    out = rows["label"].astype(str)
    if "keep_rate" not in rows:
        return out
    for _, g in rows.groupby([*setup, "label"], sort=False, dropna=False):
        keeps = g["keep_rate"].dropna()
        if keeps.nunique() > 1:
            out.loc[keeps.index] = [
                f"{lab} (keep {k:g})" for lab, k in zip(g.loc[keeps.index, "label"], keeps, strict=True)
            ]
    return out


def normalize(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` (any kinds) as every reader reads them (see the module's doc). Idempotent."""
    if NORMALIZED in rows:
        return rows
    df = rows.reset_index(drop=True).copy()
    if df.empty and "method" not in df:
        return df.assign(**{NORMALIZED: pd.Series(dtype=bool), "label": pd.Series(dtype=object)})
    df["keep_rate"] = (df["keep_rate"] if "keep_rate" in df else pd.Series(float("nan"), index=df.index)).astype(float)
    df["keep_rate"] = df["keep_rate"].fillna(REFERENCE_KEEP)
    for c in OPTIONAL_TEXT:
        df[c] = df[c].fillna("").astype(str) if c in df else ""
    if "reference_method" not in df:
        df["reference_method"] = ""
    df["reference_method"] = df["reference_method"].fillna("").astype(str)
    df["machine"] = machine(df)
    if "turn" in df:
        turn = pd.to_numeric(df["turn"], errors="coerce")
        has = turn.notna()
        df.loc[has, "task"] = df.loc[has, "task"].astype(str) + "/turn" + turn[has].astype(int).astype(str)
    df[NORMALIZED] = df["method"] == df["reference_method"]
    df.loc[df[NORMALIZED], "speculator"] = ""
    for c in ("length", "batch"):
        if c in df:
            df[c] = pd.to_numeric(df[c], errors="coerce")
    if {"ttft_s", "decode_s", "output_tokens", "max_new_tokens"} <= set(df):
        # end to end at the benchmark's output length: the first token, then max_new_tokens at
        # this sample's decode time per token (answers that stop early do not look faster)
        num = {
            c: pd.to_numeric(df[c], errors="coerce") for c in ("ttft_s", "decode_s", "output_tokens", "max_new_tokens")
        }
        per_token = num["decode_s"] / num["output_tokens"].where(num["output_tokens"] > 0)
        df["e2e_s"] = num["ttft_s"] + num["max_new_tokens"] * per_token
    if "kv_bytes" in df:
        # the KV memory a method holds: the base's cache and any it keeps beside it (KV revival's
        # speculator cache). A row without the second column holds the base's only, unless its
        # policy keeps a second cache (rows written before the column): then it is unknown, not
        # the base's alone, which would understate it
        nan = pd.Series(float("nan"), index=df.index)
        extra = pd.to_numeric(df["speculator_kv_bytes"], errors="coerce") if "speculator_kv_bytes" in df else nan
        second = df["turn_policy"].isin(SECOND_CACHE_POLICIES) if "turn_policy" in df else nan.notna()
        df["kv_held_bytes"] = (pd.to_numeric(df["kv_bytes"], errors="coerce") + extra.fillna(0.0)).mask(
            second & extra.isna()
        )
    df["label"] = df["method"].astype(str)
    kinds = df["kind"] if "kind" in df else pd.Series("eval", index=df.index)
    for kind, point in (("eval", POINT), ("latency", LATENCY_POINT), ("qps", POINT)):
        part = df[kinds == kind]
        if not part.empty:  # the columns a table shows; the label carries the rest where runs differ
            shown = [k for k in point if k not in LABELLED]
            df.loc[part.index, "label"] = label_variants(part, shown)
            require_one_model(df.loc[part.index], [*point, "label"] if kind == "latency" else REFERENCE_OF)
    if "keep_tokens" in df:  # a budget in tokens: keep_rate reads 1 (no fraction), the label says the budget
        tokens = pd.to_numeric(df["keep_tokens"], errors="coerce")
        has = tokens.notna()
        df.loc[has, "label"] = df.loc[has, "label"] + " (" + tokens[has].astype(int).astype(str) + " tokens)"
    return df
