"""InfiniteBench (12 tasks), as OpenBMB/InfiniteBench's open-model evaluation runs it.

``src/eval_yarn_mistral.py`` + ``src/eval_utils.py`` + ``src/prompt.py`` +
``src/compute_scores.py``: the open-model prompt templates (``yarn_mistral_templates``,
also used for Yi and ChatGLM3), middle truncation to 128K tokens of the target
tokenizer (``truncate_by_tokens``: encode, keep ``max // 2`` tokens from each end,
decode), per-task output lengths, and per-task answer parsing and metrics.

Our settings: ``truncate_len`` (default 131072) is capped by the model's max input
length; ``chat`` (default false, as the official open-model path) wraps the prompt in
the model's chat template; output lengths are capped by the runner so prompt + output
fit the model's window (math_calc asks for 30000 tokens). Labels from the hub's
all-string schema are converted to the official types (ints for math, [text, letter]
for the choice tasks).

``scorer`` picks the version of the official ``src/compute_scores.py`` that scores the
outputs (see :data:`harness.benchmarks.infinitebench.metrics.INFINITEBENCH_SCORERS`): ``"2024-08"`` (default,
OpenBMB/InfiniteBench commit ae04ef161b0d2e99eb77c0e845630b44e655bc65, with PR #22's
answer templates for Llama-3.1-style answers such as "The correct answer is B") or
``"2024-06"`` (commit 88b3daa6989da2fbe0077170d7a3c84c25d5ae58). It is in the options
(so in the run id and every row's ``benchmark_options``) and in ``metrics_version``.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from harness.benchmarks.base import Benchmark, TokenizerInfo, register_benchmark
from harness.benchmarks.infinitebench.metrics import (
    INFINITEBENCH_DEFAULT_SCORER,
    INFINITEBENCH_METRICS_VERSION,
    INFINITEBENCH_SCORERS,
    infinitebench_metrics_version,
    infinitebench_score,
    infinitebench_scorer,
)
from harness.benchmarks.sources import Source, load_rows, split_parts
from harness.types import PromptFormat, Sample
from specprefill.options import FLAG, Allowed

VERSION = f"infinitebench-1+{INFINITEBENCH_METRICS_VERSION}"

TEMPLATES: dict[str, str] = {
    "passkey": "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you about the important information.\n\n{context}\n\n{input}\n\nThe pass key is",
    "number_string": "There is an important info hidden inside a lot of irrelevant text. Find it. I will quiz you about the important information there.\n\n{context}\n\n{input}\n\nThe sequence of digits is",
    "kv_retrieval": "Extract the value corresponding to the specified key in the JSON object below.\n\n{context}\n\n{input}",
    "longbook_sum_eng": "Summarize the book below.\n\n{context}\n\nSummary:",
    "longbook_choice_eng": "Read the book and answer the question.\n\n{context}\n\nQuestion: {question}\nA. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}\n\nThe letter of the correct answer is",
    "longbook_qa_eng": "Read the book and answer the question. Be very concise in your answer.\n\n{context}\n\nQuestion: {question}\nAnswer:",
    "longbook_qa_chn": "阅读以下书籍然后回答问题。\n\n{context}\n\n问题：{question}\n答案：",
    "math_find": "{prefix}\n\n{context}\n\n{input}",
    "math_calc": "Let us calculate the intermediate values of an expression.\n\nExpression: 1 + 3 + 4\nValues: [1, 4, 8]\n\nExpression: 8 - 3 + 2 - 4\nValues: [8, 5, 7, 3]\n\nExpression: {context}\nValues:",
    "code_run": "There is a function called {func} in the following Python code.\n\n{context}\n\nPlease compute the exact value of {func_call}. The value of {func_call} is",
    "code_debug": "Following is a Python code where exactly one of the functions/methods has a deliberate error that makes it crash.\n\n{context}\n\nOptions:\nA. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}\n\nThe correct option is:",
    "longdialogue_qa_eng": 'Below is a dialogue script where one random occurrence of a character name is replaced with "$$MASK$$", and you should try to guess who that character is.\n\n{context}\n\nThe name that has been replaced with $$MASK$$ is likely',
}

MAX_NEW_TOKENS: dict[str, int] = {
    "passkey": 6,
    "number_string": 12,
    "kv_retrieval": 50,
    "longbook_sum_eng": 1200,
    "longbook_choice_eng": 40,
    "longbook_qa_eng": 40,
    "longbook_qa_chn": 40,
    "longdialogue_qa_eng": 40,
    "math_find": 3,
    "math_calc": 30000,
    "code_run": 5,
    "code_debug": 5,
}

CATEGORY: dict[str, str] = {
    **dict.fromkeys(["passkey", "number_string", "kv_retrieval"], "retrieval"),
    **dict.fromkeys(["longbook_sum_eng", "longbook_choice_eng", "longbook_qa_eng", "longbook_qa_chn"], "novel"),
    "longdialogue_qa_eng": "dialogue",
    **dict.fromkeys(["math_find", "math_calc"], "math"),
    **dict.fromkeys(["code_run", "code_debug"], "code"),
}

TASKS = tuple(TEMPLATES)
OPTIONS = "ABCD"


def fill(task: str, eg: dict[str, Any]) -> dict[str, str]:
    """The template fields of one example (``create_prompt``), context excluded."""
    if task == "code_run":
        func_call = re.findall(r"func_[0-9]+\(\-?[0-9]+\)", eg["input"])[0]
        return {"func": func_call.split("(")[0], "func_call": func_call}
    if task in ("code_debug", "longbook_choice_eng"):
        opts = {f"OPTION_{k}": eg["options"][i] for i, k in enumerate(OPTIONS)}
        return {**opts, "question": eg.get("input", "")} if task == "longbook_choice_eng" else opts
    if task in ("longbook_qa_eng", "longbook_qa_chn"):
        return {"question": eg["input"]}
    if task == "math_find":
        found = re.findall(r"The .+ of", eg["input"])
        if not found:
            raise ValueError(f"math_find: cannot find the target number in {eg['input']!r}")
        return {"prefix": f"What is {found[0].lower()[:-3]} in the following list?", "input": eg["input"]}
    if task in ("longbook_sum_eng", "math_calc", "longdialogue_qa_eng"):
        return {}
    return {"input": eg["input"]}


def label(task: str, eg: dict[str, Any]) -> Any:
    """The ground truth in the official types (``get_answer``), whatever the source schema."""
    ans = eg["answer"]
    if task in ("code_debug", "longbook_choice_eng"):
        if isinstance(ans, list) and len(ans) == 2 and ans[1] in OPTIONS:
            return list(ans)
        text = ans[0] if isinstance(ans, list) else ans
        return [text, OPTIONS[list(eg["options"]).index(text)]]
    if task == "math_find":
        v = ans[0] if isinstance(ans, list) else ans
        if isinstance(v, str):
            return float(v) if "." in v else int(v)
        return v
    if task == "math_calc":
        vals = ans[0] if ans and isinstance(ans[0], list) else ans
        if len(vals) == 1 and isinstance(vals[0], str) and "," in vals[0]:  # "[1, 4, 8]" as one string
            vals = re.findall(r"-?\d+", vals[0])
        return [int(v) for v in vals]
    return [str(a) for a in ans] if isinstance(ans, list) else [str(ans)]


def truncate_by_tokens(text: str, tokenizer: Any, max_tokens: int) -> str:
    """The official middle truncation: encode, keep ``max // 2`` from each end, decode."""
    tokens = tokenizer.encode(text)
    if len(tokens) <= max_tokens:
        return text
    split = max_tokens // 2
    return str(tokenizer.decode(tokens[:split] + tokens[-split:], skip_special_tokens=True))


@register_benchmark
class InfiniteBench(Benchmark):
    """Options: ``truncate_len``, ``chat``, ``data_dir``, ``hub_id``, ``revision``, ``scorer``."""

    name = "infinitebench"
    version = VERSION
    metrics_version = INFINITEBENCH_METRICS_VERSION
    all_tasks = TASKS
    allowed_options: ClassVar[dict[str, Allowed]] = {
        "truncate_len": Allowed(int, ge=1, null=True, note="tokens; null: 128K, the official"),
        "chat": FLAG,
        "data_dir": Allowed(str, null=True, note="a folder of the benchmark's files"),
        "hub_id": Allowed(str, null=True),
        "revision": Allowed(str, null=True),
        "scorer": Allowed(str, null=True, choices=tuple(INFINITEBENCH_SCORERS)),
    }

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)  # the options against their declarations
        opts = dict(cfg.options)
        self.truncate_len = int(opts.get("truncate_len") or 128 * 1024)
        self.chat = bool(opts.get("chat", False))
        self.data_dir = opts.get("data_dir")
        self.hub_id = str(opts.get("hub_id") or "xinrongzhang2022/InfiniteBench")
        self.revision = opts.get("revision")
        scorer = opts.get("scorer")
        self.scorer = infinitebench_scorer(INFINITEBENCH_DEFAULT_SCORER if scorer is None else scorer)
        # Per run, not per class: the scorer is an option. (``Benchmark`` declares it a
        # ClassVar; run.py reads it from the instance.)
        self.metrics_version = infinitebench_metrics_version(self.scorer)  # type: ignore[misc]

    def check_model(self, max_context: int) -> None:
        """Prompts are truncated to the model's max input length, so any window works."""

    def max_new_tokens(self) -> int:
        return max(MAX_NEW_TOKENS[t] for t in self.tasks)

    def options(self) -> dict[str, Any]:
        return {
            **super().options(),
            "truncate_len": self.truncate_len,
            "chat": self.chat,
            "hub_id": self.hub_id,
            "revision": self.revision,
            "scorer": self.scorer,
        }

    def source(self, task: str) -> Source:
        return Source(self.hub_id, None, task, self.revision, self.data_dir, task)

    def samples(self, tok: TokenizerInfo) -> list[Sample]:
        from tqdm.auto import tqdm

        if tok.tokenizer is None or tok.max_input_length < 1:
            raise ValueError(f"{self.name} needs the target tokenizer and the model's max_input_length to truncate")
        budget = min(self.truncate_len, tok.max_input_length)
        rows = {t: load_rows(self.source(t), self.cfg.limit) for t in self.tasks}  # all data before any work
        fmt = tok.fmt if self.chat else PromptFormat("base")
        out = []
        for task in tqdm(self.tasks, desc=f"{self.name} prompts", unit="task", leave=False):
            for i, eg in enumerate(rows[task]):
                out.append(self._sample(task, i, eg, tok, fmt, budget))
        return out

    def _sample(
        self, task: str, index: int, eg: dict[str, Any], tok: TokenizerInfo, fmt: PromptFormat, budget: int
    ) -> Sample:
        fields = fill(task, eg)
        head_t, tail_t = TEMPLATES[task].split("{context}")
        head, tail = head_t.format(**fields), tail_t.format(**fields)
        context = str(eg["context"])
        head, context, tail = split_parts(truncate_by_tokens(head + context + tail, tok.tokenizer, budget), head, tail)
        lab = label(task, eg)
        refs = [str(x) for x in lab] if isinstance(lab, list) else [str(lab)]
        return Sample(
            benchmark=self.name,
            task=task,
            sample_id=index,
            length=budget,
            instruction=head,
            context=context,
            question=tail,
            answer_prefix="",
            prompt=fmt.wrap(head, context, tail),
            references=tuple(refs),
            max_new_tokens=MAX_NEW_TOKENS[task],
            metric=task,
            add_special_tokens=fmt.add_special_tokens,
            category=CATEGORY[task],
            label_json=json.dumps(lab, ensure_ascii=False),
        )

    def score(self, sample: Sample, prediction: str) -> float:
        return 100.0 * infinitebench_score(sample.task, prediction, json.loads(sample.label_json), self.scorer)
