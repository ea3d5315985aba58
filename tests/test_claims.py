"""Every interval the READMEs quote is in a committed summary (harness/claims.py)."""

from __future__ import annotations

from harness import claims


def test_every_quoted_interval_is_in_a_committed_summary():
    missing = claims.unfound()
    assert not missing, "\n".join(f"{q.path}:{q.line}: {q.text}" for q in missing)


def test_a_quote_the_summary_does_not_hold_is_found(tmp_path):
    summary = tmp_path / "summary.md"
    summary.write_text("| specprefill | 0.1 | 0.73 [0.50, 1.04] | 1.40x [1.30x, 1.52x] |\n")
    csv = tmp_path / "table.csv"
    csv.write_text("method,retention,retention_lo,retention_hi\nfull,0.9312,0.8261,1.0\n")
    doc = tmp_path / "README.md"
    doc.write_text(
        "SpecPrefill keeps 0.73 [0.50, 1.04] at 1.40x [1.30,\n"  # found, the second across a line break
        "1.52]; retention 0.93 [0.83, 1.00] (the CSV's, rounded);\n"
        "re-rendered: 0.73 [0.49, 1.04]; typed wrong: 1.41x [1.30, 1.52]; old: 2.1x [1.9, 2.3] (superseded).\n"
        "a wrapped, indented quote is read too: 1.10\n  [0.97, 1.32];\n"
    )
    have = claims.pool([summary, csv])
    wrong = [q for q in claims.quotes(doc) if not any(claims._matches(q.numbers, h) for h in have)]
    assert [(q.text, q.line) for q in wrong] == [
        ("0.73 [0.49, 1.04]", 3),
        ("1.41x [1.30, 1.52]", 3),
        ("1.10   [0.97, 1.32]", 4),
    ]
    assert claims.same_value(wrong[0], have) == ["0.73 [0.50, 1.04]"]


def test_a_results_readme_quotes_its_own_folder_only():
    readme = claims.ROOT / "results" / "reference" / "multiturn_qwen_cpu" / "README.md"
    own = claims.summaries_for(readme)
    assert own and all("multiturn_qwen_cpu" in str(p) for p in own)
    assert len(claims.summaries_for(claims.ROOT / "README.md")) > len(own)
