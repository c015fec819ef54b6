"""A node's worker (``NodeWorker``, in this process, not as an actor) builds its router
replica from the head's state at its start: a configured backend the head removed is
never added (an SGLang server, which cannot serve an adapter, would make the start
fail after a LoRA load, and the node would never get a worker), every other
token-level backend names the head's adapter but those whose load of it failed on the
head, and a backend added later names it too."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rollserve.cluster.protocol import WorkerSettings
from rollserve.cluster.worker import NodeWorker
from rollserve.llm.backends.vllm import VLLMBackend

# Nothing listens there: the replica's health checks only mark them unhealthy.
A = json.dumps({"kind": "vllm", "url": "http://127.0.0.1:9", "name": "a"})
B = json.dumps({"kind": "vllm", "url": "http://127.0.0.1:10", "name": "b"})
S = json.dumps({"kind": "sglang", "url": "http://127.0.0.1:11", "name": "s"})
C = json.dumps({"kind": "vllm", "url": "http://127.0.0.1:12", "name": "c"})


@pytest.fixture
async def worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[NodeWorker]:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    settings = WorkerSettings(
        node="n1",
        state_dir=tmp_path,
        tokenizer="smollm2",
        scoring_workers=1,
        backends=[A, B, S],
        removed_backends=["s"],
        lora="policy-7",
        lora_failed=["b"],
        policy_version=7,
    )
    w = NodeWorker(settings.model_dump_json())
    await asyncio.wait_for(w.start(), 120)
    try:
        yield w
    finally:
        await asyncio.wait_for(w.stop(), 60)


def vllm(w: NodeWorker, name: str) -> VLLMBackend:
    backend = w.router.get(name)
    assert isinstance(backend, VLLMBackend)
    return backend


async def test_a_worker_starts_after_a_lora_load_with_a_removed_sglang_backend(worker):
    assert not worker.router.is_registered("s")
    assert worker.router.lora == "policy-7" and worker.router.policy_version == 7
    assert vllm(worker, "a").lora == "policy-7"
    assert vllm(worker, "b").lora is None  # its load failed on the head: not named here
    worker.add_backend(C, 1.0)  # added at run time: names the adapter
    assert vllm(worker, "c").lora == "policy-7"
