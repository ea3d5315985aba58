"""TTFT grid (``make latency``): full prefill and SpecPrefill side by side, batch x length.

For every grid point (``batch`` prompts of ``length`` tokens) and iteration, the same
process measures full prefill and SpecPrefill at each keep rate, interleaved, on fresh
random prompts (distinct per iteration: nothing can be reused). TTFT counts everything
up to the first token's logits: for SpecPrefill the speculator's prefill and look-ahead,
scoring and top-k selection, and the base model's prefill of the kept tokens at their
original positions. The parts are also recorded alone. Warm-up iterations are recorded
and flagged, and left out of the statistics (median, p90, p99).

Prefix caching: the transformers backend starts every prefill from an empty
``DynamicCache`` — there is no prefix cache to disable. The vLLM backend disables it and
asserts so at engine start: with repeated prompts a prefix cache would measure the
cache, not the prefill (and with SpecPrefill's original positions it would be wrong).
On vLLM the speculator runs on transformers in this process and the base prefill is
timed as one ``generate`` call of the whole batch with one output token each.

Ideal speedup (:func:`prefill_flops`): matmul FLOPs of the linear layers (all prompt
tokens, LM head on the last token only) plus causal attention (QK^T and AV over the
token pairs), for the base on N tokens versus the speculator on N tokens (+ look-ahead
steps) plus the base on K kept tokens (kept tokens attend to kept tokens only).
Efficiency = measured speedup / ideal speedup, per grid point and keep rate.

Models may be randomly initialised with real shapes (``conf/model/synth*.yaml``): prefill
compute does not depend on the weights; the rows say ``model_weights=random``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from harness.models import BYTES_PER_PARAM, ModelConfig, check_runnable, resources
from harness.report import md_table
from harness.run import _dataclass_from, config_hash, git_sha, hardware, versions
from specprefill.core import select_tokens, token_importance
from specprefill.plan import check_keep

# --------------------------------------------------------------------------- FLOPs model


@dataclass(frozen=True)
class Shape:
    """What the FLOPs model needs of a Llama-style decoder."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, config: Any) -> Shape:
        hd = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
                   config.num_key_value_heads, hd, config.intermediate_size, config.vocab_size)  # fmt: skip

    @property
    def linear_per_token(self) -> int:
        """Multiply-add FLOPs (x2) of one token through every layer's projections and MLP."""
        d, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return self.layers * 2 * (d * q + 2 * d * kv + q * d + 3 * d * self.intermediate)

    @property
    def attention_per_pair(self) -> int:
        """FLOPs of one (query, key) pair in every layer: QK^T and AV, all heads."""
        return self.layers * 4 * self.heads * self.head_dim


def prefill_flops(shape: Shape, tokens: int, pairs: int) -> int:
    """One sequence: ``tokens`` through the linear layers, ``pairs`` attention pairs, LM head once."""
    return tokens * shape.linear_per_token + pairs * shape.attention_per_pair + 2 * shape.hidden * shape.vocab


def causal_pairs(n: int) -> int:
    return n * (n + 1) // 2


def ideal(base: Shape, spec: Shape, n: int, k: int, lookahead: int) -> tuple[int, int, float]:
    """(full FLOPs, SpecPrefill FLOPs, ideal speedup) for one prompt of ``n`` tokens keeping ``k``."""
    full = prefill_flops(base, n, causal_pairs(n))
    speculator = prefill_flops(spec, n, causal_pairs(n))
    for step in range(lookahead - 1):  # look-ahead decode steps: one token attending to n + step + 1
        speculator += prefill_flops(spec, 1, n + step + 1)
    method = speculator + prefill_flops(base, k, causal_pairs(k))
    return full, method, full / method


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class LatencyConfig:
    model: ModelConfig
    grid: tuple[tuple[int, int], ...]  # (batch, length)
    keeps: tuple[float, ...]
    lookahead: int = 1
    pool_kernel: int | None = 13
    chunk_size: int | None = 32
    warmup: int = 1
    iters: int = 3
    seed: int = 0
    out: Path = Path("results/latency")
    backend: str = "transformers"

    def __post_init__(self) -> None:
        if not self.grid:
            raise ValueError("grid is empty; give [[batch, length], ...]")
        for point in self.grid:
            if len(point) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in point):
                raise ValueError(f"grid point {list(point)!r} is invalid; allowed: [batch >= 1, length >= 1]")
            if point[1] + self.lookahead - 1 > self.model.max_context:
                raise ValueError(
                    f"grid length {point[1]} (+{self.lookahead - 1} look-ahead tokens) is beyond the model's context window "
                    f"({self.model.max_context} tokens)"
                )
        if not self.keeps:
            raise ValueError("keeps is empty; give e.g. [0.1, 0.3, 0.5]")
        for k in self.keeps:
            check_keep(k)
        if self.model.speculator is None:
            raise ValueError(f"model {self.model.name!r} has no speculator; SpecPrefill latency needs one")
        if self.warmup < 0 or self.iters < 1:
            raise ValueError(f"warmup={self.warmup}, iters={self.iters}; allowed: warmup >= 0, iters >= 1")
        if self.backend not in ("transformers", "vllm"):
            raise ValueError(f"backend={self.backend!r}; allowed: ['transformers', 'vllm']")

    @classmethod
    def from_hydra(cls, cfg: DictConfig) -> LatencyConfig:
        d: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
        return cls(
            model=_dataclass_from(ModelConfig, dict(d["model"]), "model config"),
            grid=tuple((int(p[0]), int(p[1])) if len(p) == 2 else tuple(p) for p in d["grid"]),  # type: ignore[misc]
            keeps=tuple(float(k) for k in d["keeps"]),
            lookahead=int(d["lookahead"]),
            pool_kernel=d["pool_kernel"],
            chunk_size=d["chunk_size"],
            warmup=int(d["warmup"]),
            iters=int(d["iters"]),
            seed=int(d["seed"]),
            out=Path(d["out"]),
            backend=str(d["backend"]),
        )

    def identity(self) -> str:
        d = dataclasses.asdict(self)
        d.pop("out")
        return config_hash(d)

    def folder(self) -> Path:
        return self.out / self.model.name / f"latency-{self.backend}-{self.identity()}"


def plan_text(cfg: LatencyConfig) -> str:
    """What a run would do and need, without loading anything (``dry_run=true``)."""
    m = cfg.model
    shape = m.shape
    lines = [
        f"latency plan: model {m.name} ({m.weights} weights, {m.dtype}), speculator {m.speculator}, backend {cfg.backend}",
        f"  SpecPrefill: keeps {list(cfg.keeps)}, lookahead {cfg.lookahead}, pool {cfg.pool_kernel}, chunk {cfg.chunk_size}",
        f"  {cfg.warmup} warm-up + {cfg.iters} timed iterations per point; each: full + {len(cfg.keeps)} keep rates",
        f"  {resources(m, cfg.backend)}; this machine: {'cuda' if torch.cuda.is_available() else 'cpu'}",
        f"  results: {cfg.folder()}",
    ]
    for b, n in cfg.grid:
        kv = ""
        if shape:
            per_tok = 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"]
            kv = f", base KV cache {b * n * per_tok * BYTES_PER_PARAM[m.dtype] / 2**30:.2f} GiB"
        lines.append(f"  point batch={b} length={n} ({b * n} tokens){kv}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- measurement


def _stats(x: pd.Series) -> dict[str, float]:
    a = x.to_numpy(dtype=float)
    return {"median": float(np.median(a)), "p90": float(np.percentile(a, 90)), "p99": float(np.percentile(a, 99))}


def measure_point(cfg: LatencyConfig, backend: Any, batch: int, length: int, common: dict[str, Any]) -> list[dict]:
    """All iterations of one grid point; rows for full prefill and every keep rate."""
    base_shape = Shape.of(backend.base_config)
    spec = getattr(backend, "speculator_backend", None) or backend  # vLLM: the speculator runs on transformers
    spec_shape = Shape.of(spec.speculator.config)
    vocab = min(len(backend.tokenizer), base_shape.vocab, spec_shape.vocab)
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + batch * 7919 + length)
    rows: list[dict] = []
    for it in tqdm(range(cfg.warmup + cfg.iters), desc=f"batch {batch} x {length}", unit="iter", leave=False):
        ids = torch.randint(0, vocab, (batch, length), generator=gen)  # fresh prompts every iteration
        point = {**common, "batch": batch, "length": length, "iteration": it, "warmup": it < cfg.warmup}
        positions = torch.arange(length).unsqueeze(0).expand(batch, length)
        full_s = backend.prefill_batch(ids, positions)
        f_full, _, _ = ideal(base_shape, spec_shape, length, length, 1)
        rows.append({**point, "method": "full", "keep_rate": 1.0, "kept_tokens": length, "ttft_s": full_s,
                     "speculator_s": 0.0, "selection_s": 0.0, "base_prefill_s": full_s,
                     "flops_full": f_full, "flops_method": f_full, "ideal_speedup": 1.0})  # fmt: skip
        for keep in cfg.keeps:
            t0 = time.perf_counter()
            caps = backend.speculate_batch(ids, cfg.lookahead)
            t1 = time.perf_counter()
            kept = [
                select_tokens(token_importance(c.queries, c.keys, cfg.pool_kernel), keep, cfg.chunk_size) for c in caps
            ]
            t2 = time.perf_counter()
            k = min(int(x.shape[0]) for x in kept)  # equal lengths give equal K; guard anyway
            kept_t = torch.stack([x[:k] for x in kept])
            base_s = backend.prefill_batch(torch.gather(ids, 1, kept_t), kept_t)  # original positions
            f_full, f_method, ideal_speedup = ideal(base_shape, spec_shape, length, k, cfg.lookahead)
            rows.append({**point, "method": "specprefill", "keep_rate": keep, "kept_tokens": k,
                         "ttft_s": (t2 - t0) + base_s, "speculator_s": t1 - t0, "selection_s": t2 - t1,
                         "base_prefill_s": base_s, "flops_full": f_full, "flops_method": f_method,
                         "ideal_speedup": ideal_speedup})  # fmt: skip
    return rows


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Per grid point and keep rate: TTFT median/p90/p99, speedup (median full / median
    method, same run), ideal speedup, efficiency, and the selection step's share of full."""
    timed = df[~df["warmup"]]
    out = []
    for (model, backend, batch, length), g in timed.groupby(["model", "backend", "batch", "length"], sort=True):
        full = g[g["method"] == "full"]
        full_med = float(np.median(full["ttft_s"]))
        for (method, keep), h in g.groupby(["method", "keep_rate"], sort=True):
            s = _stats(h["ttft_s"])
            speedup = full_med / s["median"]
            ideal_speedup = float(h["ideal_speedup"].iloc[0])
            out.append({
                "model": model, "backend": backend, "batch": batch, "length": length, "method": method,
                "keep_rate": keep, "n": len(h), "ttft_median_s": s["median"], "ttft_p90_s": s["p90"],
                "ttft_p99_s": s["p99"], "speculator_median_s": float(np.median(h["speculator_s"])),
                "selection_median_s": float(np.median(h["selection_s"])),
                "base_prefill_median_s": float(np.median(h["base_prefill_s"])),
                "speedup": speedup, "ideal_speedup": ideal_speedup, "efficiency": speedup / ideal_speedup,
                "selection_share_of_full": float(np.median(h["selection_s"])) / full_med,
            })  # fmt: skip
    return pd.DataFrame(out)


def to_markdown(s: pd.DataFrame) -> str:
    if s.empty:
        return "(no results)\n"
    cols = ["model", "backend", "batch", "length", "method", "keep_rate", "n", "ttft_median_s", "ttft_p90_s",
            "ttft_p99_s", "speculator_median_s", "selection_median_s", "speedup", "ideal_speedup", "efficiency",
            "selection_share_of_full"]  # fmt: skip
    return md_table(
        s[cols].astype(object).map(lambda v: f"{v:.3f}" if isinstance(v, float) and not v.is_integer() else v)
    )


def plot(s: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = s[s["method"] == "specprefill"]
    if spec.empty:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for (b, n), g in spec.groupby(["batch", "length"]):
        line = ax.plot(g["keep_rate"], g["speedup"], marker="o", label=f"measured {b}x{n}")
        ax.plot(g["keep_rate"], g["ideal_speedup"], ls="--", color=line[0].get_color(), label=f"ideal {b}x{n}")
    ax.set_xlabel("keep rate")
    ax.set_ylabel("TTFT speedup over full prefill")
    ax.set_title(f"{spec['model'].iloc[0]} ({spec['backend'].iloc[0]})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(cfg: LatencyConfig) -> Path:
    """Measure every grid point not already in the folder (a killed run resumes by point)."""
    from harness.run import make_backend

    folder = cfg.folder()
    parts = folder / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(json.loads(json.dumps(dataclasses.asdict(cfg), default=str))))
    check_runnable(cfg.model)
    model = cfg.model
    if cfg.backend == "vllm":  # the engine sizes its KV cache for max_model_len: only what the grid needs
        need = max(n for _, n in cfg.grid) + cfg.lookahead + 16
        model = dataclasses.replace(model, max_context=min(model.max_context, need))
    backend = make_backend(model, cfg.backend)
    common = {
        "run_id": folder.name, "git_sha": git_sha(), "model": cfg.model.name, "model_weights": cfg.model.weights,
        "dtype": cfg.model.dtype, "speculator": cfg.model.speculator, "backend": cfg.backend,
        "lookahead": cfg.lookahead, "pool_kernel": cfg.pool_kernel, "chunk_size": cfg.chunk_size,
        "hardware": hardware(), "versions": json.dumps(versions(), sort_keys=True), "prefix_cache": False,
    }  # fmt: skip
    for batch, length in tqdm(cfg.grid, desc="latency grid", unit="point"):
        part = parts / f"b{batch}-n{length}.parquet"
        if part.exists():
            continue
        rows = measure_point(cfg, backend, batch, length, {**common, "timestamp": time.time()})
        tmp = part.with_suffix(".tmp")
        pd.DataFrame(rows).to_parquet(tmp, index=False)
        tmp.rename(part)
    write_summary(folder)
    return folder


def read_rows(folder: Path) -> pd.DataFrame:
    files = sorted((folder / "parts").glob("*.parquet"))
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True) if files else pd.DataFrame()


def write_summary(folder: Path) -> pd.DataFrame:
    s = summarize(read_rows(folder))
    s.to_csv(folder / "summary.csv", index=False)
    (folder / "summary.md").write_text(to_markdown(s))
    plot(s, Path("plots") / "latency" / f"{folder.name}.png")
    return s


@hydra.main(config_path="../conf", config_name="latency", version_base="1.3")
def main(cfg: DictConfig) -> None:
    lc = LatencyConfig.from_hydra(cfg)
    if cfg.get("dry_run", False):
        print(plan_text(lc))
        return
    folder = run(lc)
    print(f"\nTTFT grid of {folder} (also summary.md, plots/latency/{folder.name}.png):\n")
    print((folder / "summary.md").read_text())


if __name__ == "__main__":
    main()
