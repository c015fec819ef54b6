"""A scripted task family for engine tests: each instance says what its stages do."""

import asyncio

import pytest

from rollserve.commands.dataset_check import offline_context
from rollserve.engine.pipeline import Engine, EngineConfig
from rollserve.engine.store import SQLiteStore
from rollserve.errors import AgentError, InfraError, NodeLost
from rollserve.handlers.base import Evaluation, HandlerDefaults, InvalidInstance
from rollserve.handlers.registry import UnknownDataSource
from rollserve.handlers.scoring import ScoringTimeout


class ScriptedHandler:
    name = "scripted"
    defaults = HandlerDefaults(init_timeout=5, run_timeout=5, eval_timeout=5, total_timeout=20)

    def __init__(self):
        self.lost: dict[str, int] = {}  # rollout id -> attempts its node died under
        self.cleaned: list[str] = []
        self.started: dict[str, list[str]] = {"init": [], "run": [], "eval": []}
        self.events: list[tuple[str, str, str]] = []  # (start|end, stage, rollout id), in order

    def validate(self, instance):
        if "reward" in instance and not isinstance(instance["reward"], (int, float)):
            raise InvalidInstance("reward", "must be a number")

    async def _stage(self, rollout, stage):
        self.started[stage].append(rollout.id)
        self.events.append(("start", stage, rollout.id))
        spec = rollout.instance
        await asyncio.sleep(spec.get(f"{stage}_sleep", 0))
        self.events.append(("end", stage, rollout.id))
        if spec.get("fail") == stage:
            kinds = {"agent": AgentError, "scoring_timeout": ScoringTimeout}
            error = kinds.get(spec.get("fail_kind", ""), InfraError)
            raise error(f"scripted failure in {stage}")
        if spec.get("crash") == stage:
            raise RuntimeError("handler bug")
        if spec.get("node_dies") == stage and self.lost.get(rollout.id, 0) < spec["times"]:
            # What a cluster executor raises when the node running the stage dies.
            self.lost[rollout.id] = self.lost.get(rollout.id, 0) + 1
            raise NodeLost(f"node n1 died during {stage}", "n1")

    async def init(self, rollout):
        await self._stage(rollout, "init")

    async def run(self, rollout):
        await self._stage(rollout, "run")
        rollout.stats.update(rollout.instance.get("stats", {}))  # what a plugin might add

    async def eval(self, rollout):
        await self._stage(rollout, "eval")
        details = {"ok": True}
        if rollout.instance.get("odd_details"):  # what a plugin might put in them
            details.update(pair=(1, 2), by_id={7: "x"}, seen={3})
        return Evaluation(reward=rollout.instance.get("reward", 1.0), details=details)

    async def cleanup(self, rollout):
        self.cleaned.append(rollout.id)


class OneHandlerRegistry:
    def __init__(self, handler):
        self.handler = handler

    def create(self, name, ctx):
        if name != self.handler.name:
            raise UnknownDataSource(name, self.names())
        return self.handler

    def names(self):
        return [self.handler.name]


class NullRouter:
    def session(self, key):
        return None

    def list(self):
        return []


@pytest.fixture
def handler():
    return ScriptedHandler()


@pytest.fixture
async def make_engine(tmp_path, handler):
    engines = []

    async def make(path=None, **config):
        store = SQLiteStore(path or tmp_path / "store.db")
        await store.open()
        engine = Engine(
            store,
            OneHandlerRegistry(handler),
            NullRouter(),
            EngineConfig(**config),
            offline_context(runtime="local", state_dir=tmp_path),
        )
        await engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.stop()
        await engine.store.close()
