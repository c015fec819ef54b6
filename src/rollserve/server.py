"""The composition root: builds store, handlers, router and engine from settings."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
from pathlib import Path

from pydantic import BaseModel, Field

from rollserve.engine.pipeline import Engine, EngineConfig
from rollserve.engine.store import SQLiteStore
from rollserve.handlers.base import HandlerContext
from rollserve.handlers.registry import HandlerRegistry
from rollserve.handlers.scoring import ScoringPool
from rollserve.llm.factory import backend_from_spec
from rollserve.llm.router import Router
from rollserve.llm.tokenizer import ChatTokenizer

log = logging.getLogger(__name__)


def default_state_dir() -> Path:
    return Path(os.environ.get("ROLLSERVE_STATE_DIR", "~/.local/state/rollserve")).expanduser()


def _warm_imports() -> None:
    for module in ("reasoning_gym",):
        try:
            importlib.import_module(module)
        except ImportError:
            log.warning("could not import %s; its tasks will fail validation", module)


class ServerConfig(BaseModel):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    state_dir: Path = Field(default_factory=default_state_dir)
    store_path: Path | None = None  # default: <state_dir>/rollserve.db
    api_token: str | None = None
    tokenizer: str = "smollm2"
    backends: list[str] = Field(default_factory=list)
    scoring_workers: int = Field(2, ge=1)
    scoring_timeout: float = Field(10.0, gt=0)
    engine: EngineConfig = Field(default_factory=EngineConfig)

    @property
    def db_path(self) -> Path:
        return self.store_path or self.state_dir / "rollserve.db"


class Service:
    """Everything one rollserve node runs, started and stopped together."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.tokenizer = ChatTokenizer.load(config.tokenizer)
        self.store = SQLiteStore(config.db_path)
        self.scoring = ScoringPool(workers=config.scoring_workers,
                                   default_timeout=config.scoring_timeout)
        self.router = Router()
        self.handlers = HandlerRegistry()
        context = HandlerContext(tokenizer=self.tokenizer, scoring=self.scoring)
        self.engine = Engine(self.store, self.handlers, self.router, config.engine, context)
        self.recovered: dict[str, int] = {}

    async def start(self) -> None:
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        await self.store.open()
        await self.scoring.astart()
        # Handlers validate instances on the event loop at submit time; import the
        # heavy task libraries now, in a thread, so the first submit does not stall it.
        await asyncio.to_thread(_warm_imports)
        for spec in self.config.backends:
            self.router.add(backend_from_spec(spec))
        self.recovered = await self.engine.start()

    async def stop(self) -> None:
        await self.engine.stop()
        for backend in self.router.list():
            await self.router.remove(backend["name"])  # closes its connections
        await self.scoring.aclose()
        await self.store.close()
