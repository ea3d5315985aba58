"""The length search: the largest haystack whose prompt, with the tokens to generate, fits the
target length (bisection, where the official scripts grow it step by step)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.benchmarks.ruler.generators import QA, TaskGen, VariableTracking, answer_tokens, make_generator
from harness.benchmarks.ruler.tasks import SEED, TASKS, Parts, Rng
from harness.types import PromptFormat, Sample


def _largest_fitting(fits: Callable[[int], bool], lo: int, hi: int | None) -> int:
    """Largest n in [lo, hi] with fits(n), assuming fits is monotone (True, then False).

    Doubling from ``lo`` then bisection: O(log n) probes, each no larger than twice the
    answer, instead of the official O(n / increment) probes."""
    cap = hi
    if not fits(lo):
        return lo
    hi_try = lo * 2
    while (cap is None or hi_try < cap) and fits(hi_try):
        lo, hi_try = hi_try, hi_try * 2
    if cap is not None and hi_try >= cap:
        if fits(cap):
            return cap
        hi_try = cap
    hi_ = hi_try
    while hi_ - lo > 1:
        mid = (lo + hi_) // 2
        if fits(mid):
            lo = mid
        else:
            hi_ = mid
    return lo


def generate(
    task: str,
    length: int,
    num_samples: int,
    fmt: PromptFormat,
    count_tokens: Callable[[str], int],
    args: dict[str, Any] | None = None,
) -> list[Sample]:
    """Generate the first ``num_samples`` samples of ``task`` at ``length`` tokens.

    ``length`` is RULER's ``max_seq_length``: prompt tokens + tokens to generate.
    ``count_tokens`` counts tokens of a fully formatted prompt in the target tokenizer.
    ``args`` replace some of the task's official settings (``{"num_hops": 8}`` for vt).
    """
    if task not in TASKS:
        raise ValueError(f"unknown RULER task {task!r}; allowed: {list(TASKS)}")
    gen = make_generator(task, length, args)
    reserve = gen.tokens_to_generate if gen.reserve_generation else 0
    answer = answer_tokens(task, args)  # the answer's budget; the haystack's room keeps RULER's reserve

    def render(p: Parts) -> tuple[str, int]:
        prompt = fmt.wrap(p.instruction, p.context, p.question, p.answer_prefix)
        return prompt, len(fmt.head) + len(p.instruction)

    if isinstance(gen, VariableTracking) and length > 500:
        ex_gen = gen._example_gen
        ex_n = _largest_fitting(
            lambda n: _probe_fits(ex_gen, n, 500, PromptFormat("base"), count_tokens, ex_gen.tokens_to_generate),
            1,
            None,
        )
        ex = ex_gen.build(ex_n, Rng(SEED))
        icl = ex.instruction + ex.context + ex.question + ex.answer_prefix + " " + " ".join(ex.references) + "\n\n"
        # The rendered prompt holds the example, so counting the prompt counts it, as the
        # official adds the example's tokens to the budget.
        gen.icl = icl

    def fits(n: int) -> bool:
        if isinstance(gen, QA):
            gen.index = 0
        p = gen.build(n, Rng(SEED))
        prompt, _ = render(p)
        total = count_tokens(prompt + gen.probe_text(p)) + reserve
        return total < length if not gen.reserve_generation else total <= length

    n = _largest_fitting(fits, 1, gen.upper_bound())
    rng = Rng(SEED)
    samples = []
    for index in range(num_samples):
        used = n
        while True:
            if isinstance(gen, QA):
                gen.index = index
            p = gen.build(used, rng)
            prompt, ctx_start = render(p)
            tokens = count_tokens(prompt)
            if tokens + reserve <= length or used <= gen.step:
                break
            used -= gen.step
        samples.append(
            Sample(
                benchmark="ruler",
                task=task,
                sample_id=index,
                length=length,
                instruction=p.instruction,
                context=p.context,
                question=p.question,
                answer_prefix=p.answer_prefix,
                prompt=prompt,
                references=p.references,
                max_new_tokens=answer,
                metric=gen.metric,
                spans=tuple((ctx_start + a, ctx_start + b) for a, b in p.context_spans),
                distractor_spans=tuple((ctx_start + a, ctx_start + b) for a, b in p.distractor_spans),
                add_special_tokens=fmt.add_special_tokens,
            )
        )
    return samples


def _probe_fits(
    gen: TaskGen, n: int, length: int, fmt: PromptFormat, count_tokens: Callable[[str], int], reserve: int
) -> bool:
    p = gen.build(n, Rng(SEED))
    prompt = fmt.wrap(p.instruction, p.context, p.question, p.answer_prefix)
    return count_tokens(prompt + gen.probe_text(p)) + reserve <= length
