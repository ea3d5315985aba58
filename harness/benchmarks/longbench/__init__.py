"""LongBench (v1, 21 datasets) and LongBench-E (13 datasets in 0-4k / 4-8k / 8k+ buckets).

Follows THUDM/LongBench ``LongBench/pred.py``, ``eval.py``, ``metrics.py`` and
``config/dataset2prompt.json`` / ``dataset2maxlen.json``:

* the official prompt per dataset, filled from the sample's ``context`` and ``input``;
* truncation in the middle to the model's max input length, in tokens of the target
  tokenizer: keep the first and last ``max_len // 2`` tokens of the prompt (the
  ``truncation`` option: ``middle`` default, or ``none``, ``left``, ``context_only``);
* the chat template except for trec, triviaqa, samsum, lsht, lcc, repobench-p;
* greedy decoding, ``dataset2maxlen`` new tokens, samsum stops at a newline;
* scoring: first output line for trec/triviaqa/samsum/lsht, max over ground truths,
  x100 at aggregation; categories are macro means.

Data: a local folder (``data_dir=``, i.e. ``benchmark.options.data_dir``) holding the official ``data.zip`` layout
(``<dataset>.jsonl`` / ``<dataset>_e.jsonl``, or ``.parquet``), else the hub copy at a
pinned revision through ``datasets``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from harness.benchmarks.base import Benchmark, TokenizerInfo, register_benchmark
from harness.benchmarks.longbench.metrics import LONGBENCH_METRICS_VERSION, longbench_score
from harness.benchmarks.sources import Source, load_rows, split_parts
from harness.types import PromptFormat, Sample
from specprefill.options import Allowed

VERSION = f"longbench-1+{LONGBENCH_METRICS_VERSION}"

# (category, metric, max new tokens, prompt) per dataset: dataset2prompt.json, dataset2maxlen.json.
PROMPTS: dict[str, str] = {
    "narrativeqa": "You are given a story, which can be either a novel or a movie script, and a question. Answer the question asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\nStory: {context}\n\nNow, answer the question based on the story asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:",
    "qasper": 'You are given a scientific article and a question. Answer the question as concisely as you can, using a single phrase or sentence if possible. If the question cannot be answered based on the information in the article, write "unanswerable". If the question is a yes/no question, answer "yes", "no", or "unanswerable". Do not provide any explanation.\n\nArticle: {context}\n\n Answer the question based on the above article as concisely as you can, using a single phrase or sentence if possible. If the question cannot be answered based on the information in the article, write "unanswerable". If the question is a yes/no question, answer "yes", "no", or "unanswerable". Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:',
    "multifieldqa_en": "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following question based on the above text, only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:",
    "multifieldqa_zh": "阅读以下文字并用中文简短回答：\n\n{context}\n\n现在请基于上面的文章回答下面的问题，只告诉我答案，不要输出任何其他字词。\n\n问题：{input}\n回答：",
    "hotpotqa": "Answer the question based on the given passages. Only give me the answer and do not output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given passages. Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:",
    "2wikimqa": "Answer the question based on the given passages. Only give me the answer and do not output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given passages. Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:",
    "musique": "Answer the question based on the given passages. Only give me the answer and do not output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given passages. Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:",
    "dureader": "请基于给定的文章回答下述问题。\n\n文章：{context}\n\n请基于上述文章回答下面的问题。\n\n问题：{input}\n回答：",
    "gov_report": "You are given a report by a government agency. Write a one-page summary of the report.\n\nReport:\n{context}\n\nNow, write a one-page summary of the report.\n\nSummary:",
    "qmsum": "You are given a meeting transcript and a query containing a question or instruction. Answer the query in one or more sentences.\n\nTranscript:\n{context}\n\nNow, answer the query based on the above meeting transcript in one or more sentences.\n\nQuery: {input}\nAnswer:",
    "multi_news": "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n{context}\n\nNow, write a one-page summary of all the news.\n\nSummary:",
    "vcsum": "下面有一段会议记录，请你阅读后，写一段总结，总结会议的内容。\n会议记录：\n{context}\n\n会议总结：",
    "trec": "Please determine the type of the question below. Here are some examples of questions.\n\n{context}\n{input}",
    "triviaqa": "Answer the question based on the given passage. Only give me the answer and do not output any other words. The following are some examples.\n\n{context}\n\n{input}",
    "samsum": "Summarize the dialogue into a few short sentences. The following are some examples.\n\n{context}\n\n{input}",
    "lsht": "请判断给定新闻的类别，下面是一些例子。\n\n{context}\n{input}",
    "passage_count": "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. Please carefully read these paragraphs and determine how many unique paragraphs there are after removing duplicates. In other words, how many non-repeating paragraphs are there in total?\n\n{context}\n\nPlease enter the final count of unique paragraphs after removing duplicates. The output format should only contain the number, such as 1, 2, 3, and so on.\n\nThe final answer is: ",
    "passage_retrieval_en": 'Here are 30 paragraphs from Wikipedia, along with an abstract. Please determine which paragraph the abstract is from.\n\n{context}\n\nThe following is an abstract.\n\n{input}\n\nPlease enter the number of the paragraph that the abstract is from. The answer format must be like "Paragraph 1", "Paragraph 2", etc.\n\nThe answer is: ',
    "passage_retrieval_zh": '以下是若干段落文字，以及其中一个段落的摘要。请确定给定的摘要出自哪一段。\n\n{context}\n\n下面是一个摘要\n\n{input}\n\n请输入摘要所属段落的编号。答案格式必须是"段落1"，"段落2"等格式\n\n答案是：',
    "lcc": "Please complete the code given below. \n{context}Next line of code:\n",
    "repobench-p": "Please complete the code given below. \n{context}{input}Next line of code:\n",
}

MAX_NEW_TOKENS: dict[str, int] = {
    "narrativeqa": 128,
    "qasper": 128,
    "multifieldqa_en": 64,
    "multifieldqa_zh": 64,
    "hotpotqa": 32,
    "2wikimqa": 32,
    "musique": 32,
    "dureader": 128,
    "gov_report": 512,
    "qmsum": 512,
    "multi_news": 512,
    "vcsum": 512,
    "trec": 64,
    "triviaqa": 32,
    "samsum": 128,
    "lsht": 64,
    "passage_count": 32,
    "passage_retrieval_en": 32,
    "passage_retrieval_zh": 32,
    "lcc": 64,
    "repobench-p": 64,
}

METRIC: dict[str, str] = {
    "narrativeqa": "qa_f1_score",
    "qasper": "qa_f1_score",
    "multifieldqa_en": "qa_f1_score",
    "multifieldqa_zh": "qa_f1_zh_score",
    "hotpotqa": "qa_f1_score",
    "2wikimqa": "qa_f1_score",
    "musique": "qa_f1_score",
    "dureader": "rouge_zh_score",
    "gov_report": "rouge_score",
    "qmsum": "rouge_score",
    "multi_news": "rouge_score",
    "vcsum": "rouge_zh_score",
    "trec": "classification_score",
    "triviaqa": "qa_f1_score",
    "samsum": "rouge_score",
    "lsht": "classification_score",
    "passage_retrieval_en": "retrieval_score",
    "passage_count": "count_score",
    "passage_retrieval_zh": "retrieval_zh_score",
    "lcc": "code_sim_score",
    "repobench-p": "code_sim_score",
}

CATEGORY: dict[str, str] = {
    **dict.fromkeys(["narrativeqa", "qasper", "multifieldqa_en", "multifieldqa_zh"], "single-doc QA"),
    **dict.fromkeys(["hotpotqa", "2wikimqa", "musique", "dureader"], "multi-doc QA"),
    **dict.fromkeys(["gov_report", "qmsum", "multi_news", "vcsum"], "summarization"),
    **dict.fromkeys(["trec", "triviaqa", "samsum", "lsht"], "few-shot"),
    **dict.fromkeys(["passage_count", "passage_retrieval_en", "passage_retrieval_zh"], "synthetic"),
    **dict.fromkeys(["lcc", "repobench-p"], "code"),
}

NO_CHAT = ("trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p")
DATASETS = tuple(PROMPTS)
E_DATASETS = (
    "qasper",
    "multifieldqa_en",
    "hotpotqa",
    "2wikimqa",
    "gov_report",
    "multi_news",
    "trec",
    "triviaqa",
    "samsum",
    "passage_count",
    "passage_retrieval_en",
    "lcc",
    "repobench-p",
)
TRUNCATIONS = ("middle", "none", "left", "context_only")
FIELDS = ("input", "context", "answers", "length", "all_classes")


def bucket(length: int) -> str:
    """LongBench-E's buckets on the dataset's own ``length`` field (``eval.py`` scorer_e)."""
    return "0-4k" if length < 4000 else ("4-8k" if length < 8000 else "8k+")


def truncate(prompt: str, tokenizer: Any, max_len: int, policy: str) -> str:
    """Truncate the (un-templated) prompt to ``max_len`` tokens of the target tokenizer.

    ``middle`` is the official rule: tokenize (with special tokens, as ``pred.py``), and
    when too long keep the first and last ``int(max_len / 2)`` tokens, decoded with
    special tokens skipped. ``left`` keeps the last ``max_len`` tokens."""
    if policy == "none":
        return prompt
    ids = tokenizer(prompt, truncation=False).input_ids
    if len(ids) <= max_len:
        return prompt
    if policy == "middle":
        half = int(max_len / 2)
        return str(tokenizer.decode(ids[:half], skip_special_tokens=True)) + str(
            tokenizer.decode(ids[-half:], skip_special_tokens=True)
        )
    if policy == "left":
        return str(tokenizer.decode(ids[-max_len:], skip_special_tokens=True))
    raise ValueError(f"truncation={policy!r}; allowed: {list(TRUNCATIONS)}")


def build_sample(
    task: str, index: int, row: dict[str, Any], tok: TokenizerInfo, policy: str, max_len: int, benchmark: str, e: bool
) -> Sample:
    """One LongBench sample: official prompt, truncation, chat template, parts split."""
    missing = [f for f in FIELDS if f not in row]
    if missing:
        raise ValueError(
            f"LongBench {task} row {index} lacks field(s) {missing}; expected the official schema {FIELDS}"
        )
    template = PROMPTS[task]
    head_t, tail_t = template.split("{context}")
    head, tail = head_t.format(input=row["input"]), tail_t.format(input=row["input"])
    context = str(row["context"])
    if policy == "context_only":
        # Cut the middle of the context only, so that instruction and question survive whole.
        fixed = len(tok.tokenizer(head + tail, truncation=False).input_ids)
        budget = max(max_len - fixed, 0)
        cids = tok.tokenizer(context, add_special_tokens=False).input_ids
        if len(cids) > budget:
            half = budget // 2
            context = str(tok.tokenizer.decode(cids[:half], skip_special_tokens=True)) + str(
                tok.tokenizer.decode(cids[len(cids) - (budget - half) :], skip_special_tokens=True)
            )
    else:
        head, context, tail = split_parts(truncate(head + context + tail, tok.tokenizer, max_len, policy), head, tail)
    chat = task not in NO_CHAT
    fmt = tok.fmt if chat else PromptFormat("base")
    answers = row["answers"]
    answers = [answers] if isinstance(answers, str) else list(answers)
    length = int(row["length"])
    return Sample(
        benchmark=benchmark,
        task=task,
        sample_id=index,
        length=length,
        instruction=head,
        context=context,
        question=tail,
        answer_prefix="",
        prompt=fmt.wrap(head, context, tail),
        references=tuple(str(a) for a in answers),
        max_new_tokens=MAX_NEW_TOKENS[task],
        metric=METRIC[task],
        add_special_tokens=fmt.add_special_tokens,
        stop=("\n",) if task == "samsum" else (),
        all_classes=tuple(str(c) for c in (row.get("all_classes") or [])),
        category=CATEGORY[task],
        bucket=bucket(length) if e else "",
    )


@register_benchmark
class LongBench(Benchmark):
    """LongBench v1: 21 datasets. Options: ``truncation``, ``data_dir``, ``hub_id``, ``revision``."""

    name = "longbench"
    version = VERSION
    metrics_version = LONGBENCH_METRICS_VERSION
    all_tasks = DATASETS
    e: ClassVar[bool] = False
    default_hub: ClassVar[tuple[str, str | None]] = ("Xnhyacinth/LongBench", "2e9ade51ebf45d98942056c0716234f9d5d257d5")
    allowed_options: ClassVar[dict[str, Allowed]] = {
        "truncation": Allowed(str, choices=TRUNCATIONS),
        "data_dir": Allowed(str, null=True, note="a folder of the benchmark's files"),
        "hub_id": Allowed(str, null=True),
        "revision": Allowed(str, null=True),
    }

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)  # the options against their declarations
        opts = dict(cfg.options)
        self.truncation = str(opts.get("truncation", "middle"))
        self.data_dir = opts.get("data_dir")
        self.hub_id = str(opts.get("hub_id") or self.default_hub[0])
        self.revision = opts.get("revision", self.default_hub[1])

    def check_model(self, max_context: int) -> None:
        """LongBench truncates to the model's max input length, so any window works."""

    def max_new_tokens(self) -> int:
        return max(MAX_NEW_TOKENS[t] for t in self.tasks)  # dataset2maxlen

    def options(self) -> dict[str, Any]:
        return {**super().options(), "truncation": self.truncation, "hub_id": self.hub_id, "revision": self.revision}

    def source(self, task: str) -> Source:
        local = f"{task}_e" if self.e else task
        config = f"{task}_e" if self.e else task
        return Source(self.hub_id, config, "test", self.revision, self.data_dir, local)

    def samples(self, tok: TokenizerInfo) -> list[Sample]:
        from tqdm.auto import tqdm

        if tok.tokenizer is None or tok.max_input_length < 1:
            raise ValueError(f"{self.name} needs the target tokenizer and the model's max_input_length to truncate")
        rows = {t: load_rows(self.source(t), self.cfg.limit) for t in self.tasks}  # all data before any work
        out = []
        for task in tqdm(self.tasks, desc=f"{self.name} prompts", unit="task", leave=False):
            for i, row in enumerate(rows[task]):
                out.append(build_sample(task, i, row, tok, self.truncation, tok.max_input_length, self.name, self.e))
        return out

    def score(self, sample: Sample, prediction: str) -> float:
        return 100.0 * longbench_score(sample.task, sample.metric, prediction, sample.references, sample.all_classes)


@register_benchmark
class LongBenchE(LongBench):
    """LongBench-E: 13 datasets with a more even length distribution, scored per bucket."""

    name = "longbench_e"
    all_tasks = E_DATASETS
    e = True
