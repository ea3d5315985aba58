"""The regression gate: quality and speedup of a candidate results folder against a baseline.

``python -m harness.regress compare --baseline DIR --candidate DIR`` compares two results
folders point by point (model, benchmark, length, task, method and its options, keep):

* **Quality**: the paired difference of per-sample scores, over the samples both folders
  ran (:func:`harness.analysis.quality.paired_difference`, seeded, 2000 resamples); per
  task, and ``ALL`` as the summary takes it (over categories where the benchmark has them,
  else over tasks; a stratified bootstrap). A point regresses when the drop's 95 %
  interval excludes 0 *and* the drop exceeds ``--quality-tol`` (2 points on the 0-100
  scale): one flipped sample among many is noise, not a regression.
* **Speed**: the speedup over the reference method measured inside each folder (never
  absolute seconds across folders), from the latency rows: the paired speedup per grid
  point (:mod:`harness.analysis.speed`: the methods timed side by side, order turned over
  every iteration, interval over pairs). A point regresses when the candidate's speedup
  falls by more than ``--speed-tol`` (15 %) of the baseline's, its bootstrap interval
  included. A point whose speed claim is unsafe in either folder (its ``flags``: a speedup
  above its FLOP ideal, a failed A/A check, too few pairs) is **not comparable**, never
  passed; a baseline timed under the older protocol (the reference always first, no A/A
  check) gives no speed baseline (``not compared``, exit 3, as with no baseline) until it
  is accepted again. ``run`` measures a candidate latency run flagged unsafe once more
  before comparing (``--remeasure``; the first measurement set aside and named in the
  verdict). Without latency rows in both folders the verdict says first that
  speed was not compared. The eval runs' TTFT ratios (the reference's mean TTFT over the
  method's on the same samples, timed minutes apart: between runs) drift ~15 % between
  runs on a shared CPU, so they are compared only with ``--eval-speed``.

The verdict (``--format``): ``text`` (default) is one screen: short point labels (only the
fields that tell the points apart; what all share on one line), regressions and
improvements listed, the unchanged points folded into one line (``--all`` lists every
point). ``markdown`` is the same in at most ~25 lines for a CI step summary (``--summary
FILE`` appends it to FILE, e.g. ``$GITHUB_STEP_SUMMARY``, whatever the format); ``json`` is
machine-readable (``exit_code`` and ``exit_codes`` in it); ``junit`` is one testcase per
point, a failure per regression.

Exit status (``compare`` and ``run``; :data:`EXIT_CODES`):

* **0** pass: nothing regressed;
* **1** regressed: at least one point (each named);
* **2** not comparable: no rows, no point in common, points in only one folder with
  ``--require-all``, a speed point flagged unsafe (anomaly, failed A/A check, too few
  pairs), or a suite command that failed (argparse's own usage errors exit 2 too);
* **3** not compared: ``run`` found no baseline for this machine's class (quality is still
  compared with another class's baseline, and a quality regression there exits 1), or the
  baseline's speed rows predate the paired protocol (quality compared as usual);
* **4** refused, before comparing, in one line naming the path: a baseline or candidate
  folder that does not exist, a corrupt file in one, a ``--candidate`` folder the gate did
  not make (it removes only folders carrying its marker file), a missing suite file.

``python -m harness.regress run`` runs the fixed quick suite (``conf/regress.yaml``) into a
candidate folder and compares it with the committed baseline for this machine's class
(``results/baseline/<class>/``), appending to its ``history.csv`` and plot beside the
baseline (nothing is committed: commit them with the baseline). ``python -m harness.regress
accept --reason '...'`` promotes the candidate to the baseline.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.regress.compare import compare_verdict
from harness.regress.formats import FORMATS, render, render_markdown
from harness.regress.suite import MARKER, SUITE, SUITE_RECORD, accept, run_suite
from harness.regress.verdict import EXIT_CODES, REFUSED, ROOT, Refused, Verdict

CANDIDATE = ROOT / "results" / "regress" / "candidate"


def parser() -> argparse.ArgumentParser:
    """The three subcommands and their options (this module's docstring is the help text)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    codes = "exit status:\n" + "\n".join(f"  {k}  {v}" for k, v in EXIT_CODES.items())
    raw = argparse.RawDescriptionHelpFormatter
    c = sub.add_parser(
        "compare",
        help="compare two results folders (e.g. the last candidate, without rerunning)",
        epilog=codes,
        formatter_class=raw,
    )
    c.add_argument("--baseline", type=Path, required=True)
    c.add_argument("--candidate", type=Path, required=True)
    c.add_argument("--require-all", action="store_true", help="points in only one folder make it exit 2")
    r = sub.add_parser(
        "run",
        help="run the quick suite and compare it with this machine class's baseline",
        epilog=codes,
        formatter_class=raw,
    )
    r.add_argument(
        "--candidate",
        type=Path,
        default=CANDIDATE,
        help=f"the folder the suite writes (made by the gate: one holding its {MARKER} is removed and "
        "remade; any other non-empty folder is refused)",
    )
    r.add_argument("--suite", type=Path, default=SUITE, help="the suite file (default conf/regress.yaml)")
    r.add_argument(
        "--remeasure",
        type=int,
        default=1,
        help="measure a latency run flagged unsafe (failed A/A check, above its ideal) again this many "
        "times, the first measurement kept aside and named in the verdict (default 1; 0: never)",
    )
    r.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="compare with this baseline folder instead of results/baseline/<class>/rows (no history appended)",
    )
    a = sub.add_parser(
        "accept",
        help="promote the candidate to this machine class's baseline",
        epilog=f"takes only a folder `run` made whose suite finished ({SUITE_RECORD}), unchanged "
        "since; refused in one line (exit 1) otherwise, the baseline untouched",
    )
    a.add_argument("--candidate", type=Path, default=CANDIDATE)
    a.add_argument("--reason", required=True)
    for p in (c, r, a):
        p.add_argument("--baselines", type=Path, default=ROOT / "results" / "baseline")
    for p in (c, r):
        p.add_argument("--quality-tol", type=float, default=2.0, help="points on the 0-100 scale (default 2)")
        p.add_argument("--speed-tol", type=float, default=0.15, help="fraction of the baseline's speedup (0.15)")
        p.add_argument(
            "--eval-speed",
            action="store_true",
            help="also gate the eval runs' TTFT ratios (default: speed from the latency rows only)",
        )
        p.add_argument("--format", choices=FORMATS, default="text", help="the verdict's form on stdout (text)")
        p.add_argument("--all", action="store_true", help="text: list every point, not only the changed ones")
        p.add_argument(
            "--summary",
            type=Path,
            default=None,
            help="also append the markdown verdict to this file ($GITHUB_STEP_SUMMARY)",
        )
    return ap


def verdict(args: argparse.Namespace) -> Verdict:
    """``compare``'s or ``run``'s verdict; :class:`Refused` before comparing."""
    if args.cmd == "compare":
        return compare_verdict(
            args.baseline,
            args.candidate,
            args.quality_tol,
            args.speed_tol,
            args.require_all,
            eval_speed=args.eval_speed,
        )
    log = None if args.format == "text" else sys.stderr  # stdout carries only the verdict
    return run_suite(
        args.candidate,
        args.baselines,
        args.quality_tol,
        args.speed_tol,
        args.suite,
        args.baseline,
        args.eval_speed,
        log,
        args.remeasure,
    )


def main(argv: list[str] | None = None) -> None:
    ap = parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0].startswith("--") and argv[0] not in ("-h", "--help"):
        argv = ["compare", *argv]  # `python -m harness.regress --baseline A --candidate B`
    args = ap.parse_args(argv)
    if getattr(args, "remeasure", 0) < 0:
        ap.error(f"--remeasure {args.remeasure}: allowed: 0 (never) or more times")
    if args.cmd == "accept":
        try:
            accept(args.candidate, args.baselines, args.reason)
        except Refused as e:
            raise SystemExit(f"regress accept: {e}") from None
        return
    try:
        v = verdict(args)
    except Refused as e:
        print(f"regress: {e}", file=sys.stderr)
        v = Verdict(REFUSED, note=f"refused: {e}", quality_tol=args.quality_tol, speed_tol=args.speed_tol)
        if args.format == "text":
            if args.summary:
                with args.summary.open("a") as f:
                    f.write(render_markdown(v))
            raise SystemExit(REFUSED) from None
    print(render(v, args.format, args.all), end="", flush=True)
    if args.summary:
        with args.summary.open("a") as f:
            f.write(render_markdown(v))
    raise SystemExit(v.code)


if __name__ == "__main__":
    main()
