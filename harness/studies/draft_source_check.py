"""Study: SpecPC's and SpecKV's selection checked against the authors' own code on the same inputs.

``baselines/specpc.py`` and ``baselines/speckv.py`` restate the selection steps of Galim et al.,
"Draft-based Approximate Inference for LLMs" (arXiv 2506.08373; furiosa-ai/draft-based-approx-llm).
Their tests check them against hand-worked examples and independent statements; this runs the
authors' functions themselves, read from a checkout of their repository, beside ours on the
same random inputs:

* SpecPC: ``draft_approx_llm/specpc/specpc.py`` ``specpc_select_input_token_indices`` (pooling,
  top-k, neighbour expansion, the window, the cut to capacity) against
  :func:`baselines.specpc.specpc_select`, on draft scores of random lengths, budgets, windows,
  kernels, neighbourhoods and pool types, half of them with many tied scores;
* SpecKV: ``draft_approx_llm/speckv/util.py`` ``compress_kv`` (the window's attention to each
  key, reduced over a KV head's queries, pooled, top-k, window appended) against
  :func:`baselines.speckv.speckv_compress`, on random queries, keys and values (grouped-query
  heads, both reductions and pool types).

Their functions are executed from their files (the package's own imports left out: the
functions need torch, numpy, pandas and transformers' ``repeat_kv`` only); nothing of theirs is
copied here. A case agrees when the kept positions (SpecPC) or the compressed keys and values
(SpecKV) are identical; a disagreement is printed with its inputs. Writes a markdown report.

    git clone https://github.com/furiosa-ai/draft-based-approx-llm && git -C draft-based-approx-llm checkout d79e404
    python -m harness.studies.draft_source_check --repo draft-based-approx-llm [--cases 400]
        [--out results/reference/draft_source_check.md]
"""

from __future__ import annotations

import argparse
import ast
import random
import subprocess
import types
from pathlib import Path
from typing import Any

import torch

from baselines.speckv import speckv_compress
from baselines.specpc import specpc_select
from harness.provenance import hardware

#: The authors' commit our methods follow (the tests' and the method modules' pin).
PINNED = "d79e404"
SPECPC = "draft_approx_llm/specpc/specpc.py"
SPECKV = "draft_approx_llm/speckv/util.py"


def load_functions(path: Path) -> dict[str, Any]:
    """The module at ``path`` executed without its imports from its own package (``from
    draft_approx_llm ...``, relative imports): its functions, by name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    tree.body = [
        node
        for node in tree.body
        if not (isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("draft_approx_llm")))
    ]
    namespace: dict[str, Any] = {"__name__": f"authors.{path.stem}"}
    exec(compile(tree, str(path), "exec"), namespace)
    return namespace


def commit_of(repo: Path) -> str:
    """The checkout's commit (short), or ``unknown`` outside git."""
    done = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def _scores(rng: random.Random, n: int, ties: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    s = torch.rand(n, generator=g)
    return (s * 8).floor() / 8 if ties else s  # eight levels: most scores tied with others


def specpc_cases(theirs: Any, cases: int, seed: int) -> tuple[int, list[str]]:
    """Random SpecPC selections, theirs against ours: (agreeing cases, disagreements)."""
    rng = random.Random(seed)
    agree, bad = 0, []
    for i in range(cases):
        n = rng.randint(16, 3000)
        window = rng.randint(1, min(64, n))
        capacity = rng.randint(window, n + 64)
        kernel = rng.choice([1, 3, 5, 7, 13, 32, 64])
        neighbors = rng.choice([None, 0, 1, 5, 32, 64])
        pool = rng.choice(["max", "avg", "mean", None])
        scores = _scores(rng, n, ties=i % 2 == 1)
        config = types.SimpleNamespace(
            kernel_size=kernel,
            neighbor_tokens=neighbors,
            pool_type=pool,
            max_capacity_prompt=capacity,
            window_size=window,
        )
        a = theirs(scores[None].clone(), config)[0].tolist()
        b = specpc_select(scores.clone(), capacity, window, kernel=kernel, pool=pool, neighbors=neighbors).tolist()
        if a == b:
            agree += 1
        else:
            only = sorted(set(a) ^ set(b))[:8]
            bad.append(
                f"SpecPC case {i}: n={n} capacity={capacity} window={window} kernel={kernel} neighbors={neighbors} "
                f"pool={pool} ties={i % 2 == 1}: {len(a)} vs {len(b)} kept, differing at {only}"
            )
    return agree, bad


def speckv_cases(theirs: Any, cases: int, seed: int) -> tuple[int, list[str]]:
    """Random SpecKV compressions, theirs against ours: (agreeing cases, disagreements)."""
    rng = random.Random(seed)
    agree, bad = 0, []
    for i in range(cases):
        kv_heads, group = rng.choice([1, 2, 4]), rng.choice([1, 2, 7])
        d, s = rng.choice([8, 16, 64]), rng.randint(40, 900)
        window = rng.randint(1, min(32, s // 2))
        keep = rng.randint(1, s - window - 1)
        reduction, pool = rng.choice(["max", "mean"]), rng.choice(["max", "mean"])
        kernel = rng.choice([1, 3, 5, 7, 13])
        g = torch.Generator().manual_seed(rng.randrange(2**31))
        q = torch.randn(1, kv_heads * group, s, d, generator=g)
        k = torch.randn(1, kv_heads, s, d, generator=g)
        v = torch.randn(1, kv_heads, s, d, generator=g)
        ka, va, _ = theirs(k.clone(), q.clone(), v.clone(), window, keep + window, 0, reduction, pool, kernel)
        kb, vb = speckv_compress(q[:, :, -window:].clone(), k.clone(), v.clone(), window, keep, reduction, pool, kernel)
        if ka.shape == kb.shape and torch.equal(ka, kb) and torch.equal(va, vb):
            agree += 1
        else:
            bad.append(
                f"SpecKV case {i}: heads {kv_heads}x{group} d={d} S={s} window={window} keep={keep} "
                f"reduction={reduction} pool={pool} kernel={kernel}: shapes {tuple(ka.shape)} vs {tuple(kb.shape)}"
            )
    return agree, bad


def report(repo: Path, cases: int, seed: int) -> str:
    """Both checks as markdown."""
    sel = load_functions(repo / SPECPC)["specpc_select_input_token_indices"]
    comp = load_functions(repo / SPECKV)["compress_kv"]
    a, bad_a = specpc_cases(sel, cases, seed)
    b, bad_b = speckv_cases(comp, cases, seed + 1)
    commit = commit_of(repo)
    pin = "" if commit.startswith(PINNED) else f" (not the pinned {PINNED}: read the differences with that in mind)"
    lines = [
        "# SpecPC and SpecKV selection against the authors' code",
        "",
        f"`python -m harness.studies.draft_source_check --repo <checkout> --cases {cases} --seed {seed}`: the "
        f"authors' functions (furiosa-ai/draft-based-approx-llm at {commit}{pin}) and ours (this project at "
        f"{commit_of(Path(__file__).resolve().parents[2])}) on the same random inputs, float32, torch "
        f"{torch.__version__}, {hardware()}.",
        "",
        "| check | their function | ours | cases | identical |",
        "|---|---|---|---|---|",
        f"| SpecPC selection | `{SPECPC}` `specpc_select_input_token_indices` | `baselines/specpc.py` "
        f"`specpc_select` | {cases} | {a} |",
        f"| SpecKV compression | `{SPECKV}` `compress_kv` | `baselines/speckv.py` `speckv_compress` | {cases} | {b} |",
        "",
        "SpecPC cases: prompt lengths 16-3,000, windows 1-64, budgets from the window to past the prompt, "
        "kernels 1-64, neighbourhoods none/0/1/5/32/64 (none: the kernel), pools max/avg/mean/none; every "
        "second case's scores on eight levels, so most are tied and the order top-k returns ties in matters. "
        "SpecKV cases: 1/2/4 KV heads x 1/2/7 query heads each, head sizes 8-64, 40-900 keys, windows 1-32, "
        "budgets from 1 to all but one key before the window, max/mean reductions and pools, odd kernels 1-13 (theirs pads kernel // 2).",
        "",
    ]
    if bad_a or bad_b:
        lines += ["Disagreements:", "", *(f"* {x}" for x in bad_a + bad_b), ""]
    else:
        lines += ["Every case identical: kept positions (SpecPC) and compressed keys and values (SpecKV).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", type=Path, required=True, help="a checkout of furiosa-ai/draft-based-approx-llm")
    ap.add_argument("--cases", type=int, default=400, help="random cases per check")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("results/reference/draft_source_check.md"))
    a = ap.parse_args(argv)
    for rel in (SPECPC, SPECKV):
        if not (a.repo / rel).is_file():
            ap.error(f"--repo {a.repo}: no {rel} there; allowed: a checkout of furiosa-ai/draft-based-approx-llm")
    if a.cases < 1:
        ap.error(f"--cases {a.cases}; allowed: >= 1")
    text = report(a.repo, a.cases, a.seed)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
