import httpx
import pytest

from rollserve.api.app import create_app
from rollserve.engine.pipeline import EngineConfig
from rollserve.server import ServerConfig, Service
from rollserve.testing import FakeVLLM


@pytest.fixture
async def fake_llm():
    async with FakeVLLM("smollm2", replies=["Adding them: \\boxed{4}"], latency=0.01) as server:
        yield server


@pytest.fixture
async def make_api(tmp_path):
    """Build a service + in-process HTTP client; pass backends=[url] or none."""
    made = []

    async def make(backends=(), token=None, **engine):
        config = ServerConfig(state_dir=tmp_path / f"state{len(made)}", api_token=token,
                              backends=list(backends), engine=EngineConfig(**engine))
        service = Service(config)
        await service.start()
        app = create_app(service, manage_lifecycle=False)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                   base_url="http://rollserve", timeout=30)
        made.append((service, client))
        return service, client

    yield make
    for service, client in made:
        await client.aclose()
        await service.stop()
