"""What lm-eval's tasks read when our methods run them: our local tasks on the task path,
the tokenizer RULER's tasks size their prompts with, and RULER's own packaged files in
place of the downloads (no network)."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.benchmarks.ruler.data import data_dir
from harness.benchmarks.text import sent_tokenize
from harness.models.catalog import ModelConfig
from harness.models.loading import smollm2_dir

LOCAL_TASKS = Path(__file__).resolve().parent / "tasks"
SQUAD_URL = "https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v2.0.json"


def tokenizer_source(model: ModelConfig) -> str:
    """What RULER's lm-eval tasks load the tokenizer from to size their prompts."""

    return str(model.path) if model.source == "hub" else str(smollm2_dir())


@contextlib.contextmanager
def _no_punkt_download() -> Iterator[None]:
    """Import lm-eval's RULER module without its import-time ``nltk.download("punkt_tab")``
    when that data is not installed: its sentence splitting is replaced by our packaged Punkt
    English below, so the download is not needed, and offline it printed NLTK's error and
    then lm-eval's unconditional "Downloaded punkt_tab on rank 0", which is not true."""
    import io

    import nltk

    try:
        nltk.data.find("tokenizers/punkt_tab")
    except LookupError:
        pass
    else:
        yield
        return
    real, printed = nltk.download, io.StringIO()
    nltk.download = lambda *a, **k: False  # type: ignore[assignment]
    try:
        with contextlib.redirect_stdout(printed):
            yield
    finally:
        nltk.download = real  # type: ignore[assignment]
        rest = [ln for ln in printed.getvalue().splitlines() if ln != "Downloaded punkt_tab on rank 0"]
        if rest:
            print("\n".join(rest))


@contextlib.contextmanager
def packaged_ruler_data() -> Iterator[None]:
    """Point lm-eval's RULER tasks at RULER's own packaged files (no network): the essay
    haystack, SQuAD and HotpotQA, and Punkt English for sentences."""
    from lm_eval.tasks._yaml_loader import _load_module_with_cache

    with _no_punkt_download():
        from lm_eval.tasks.ruler import prepare_niah

    # lm-eval loads a task's `!function` modules through its own cache (re-executing a
    # module it did not load itself), so patch the copies that cache will hand out.
    ruler = Path(prepare_niah.__file__).parent
    niah_utils = _load_module_with_cache(ruler / "niah_utils.py")
    qa_utils = _load_module_with_cache(ruler / "qa_utils.py")

    local = {SQUAD_URL: data_dir() / "squad.json"}
    real_get_haystack, real_download, real_split = prepare_niah.get_haystack, qa_utils.download_json, None

    def get_haystack(type_haystack: str) -> Any:
        if type_haystack != "essay":
            return real_get_haystack(type_haystack)
        text = json.loads((data_dir() / "PaulGrahamEssays.json").read_text())["text"]
        return re.sub(r"\s+", " ", text).split(" ")

    def download_json(url: str) -> Any:
        path = local.get(url) or (data_dir() / "hotpotqa.json" if "hotpot" in url else None)
        if path is None:
            raise RuntimeError(f"ruler_data=packaged has no local copy of {url}; use ruler_data=lm-eval (network)")
        return json.loads(path.read_text())

    qa_utils.read_squad.cache_clear()
    qa_utils.read_hotpotqa.cache_clear()
    prepare_niah.get_haystack = niah_utils.get_haystack = get_haystack
    qa_utils.download_json = download_json
    real_split = prepare_niah.cached_sent_tokenize
    prepare_niah.cached_sent_tokenize = sent_tokenize
    try:
        yield
    finally:
        prepare_niah.get_haystack = niah_utils.get_haystack = real_get_haystack
        qa_utils.download_json = real_download
        prepare_niah.cached_sent_tokenize = real_split
        qa_utils.read_squad.cache_clear()
        qa_utils.read_hotpotqa.cache_clear()
