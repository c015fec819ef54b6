"""schemathesis over every operation of the real API: no 5xx, and every response
conforms to /openapi.json (status code, content type, headers, body schema).

Two servers, each `create_app` under uvicorn on a free port, with the test-double
vLLM as backend and a temporary state dir, ProRL's routes served too: one open, one
behind `--api-token` (schemathesis sends the token, and also checks that a request
without it is refused). Generation is derandomized with a bounded number of examples
per operation, so the run is repeatable and takes about two minutes on 2 cores.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig

from rollserve.api.app import create_app
from rollserve.api.prorl import ProRLConfig
from rollserve.engine.pipeline import EngineConfig
from rollserve.server import ServerConfig, Service
from rollserve.testing import FakeVLLM
from tests.waiting import wait_until

TOKEN = "schemathesis-token"
# Per operation and phase (the coverage phase adds its own boundary cases). To fuzz
# deeper locally: ROLLSERVE_SCHEMATHESIS_EXAMPLES=1000 ROLLSERVE_SCHEMATHESIS_SEED=3 pytest ...
EXAMPLES = int(os.environ.get("ROLLSERVE_SCHEMATHESIS_EXAMPLES", "12"))
SEED = int(os.environ.get("ROLLSERVE_SCHEMATHESIS_SEED", "8"))
SHORT_WAIT = 0.2  # long-poll waits are cut to this: the test checks answers, not patience
STATE = Path(tempfile.gettempdir()) / f"rollserve-schemathesis-{os.getpid()}"


def _app(token: str | None):
    """The app under test, built at import: schemathesis reads its schema to collect
    one test per operation; the fixture below serves this same app."""
    config = ServerConfig(
        state_dir=STATE / ("guarded" if token else "open"), api_token=token, engine=EngineConfig(max_pending=64)
    )
    return create_app(Service(config), prorl=ProRLConfig(timeout=10, http_timeout=15))


def _schema(app, token: str | None):
    data: dict = {
        "seed": SEED,
        "request-timeout": 90,
        "generation": {"mode": "all", "max-examples": EXAMPLES, "deterministic": True},
        "phases": {"stateful": {"enabled": False}},
        "checks": {
            # Schema-wide contract checks; positive_data_acceptance is off because a
            # schema-valid request may rightly be refused (an unknown id is a 404, a
            # data_source no handler serves is a 400), and those answers are checked
            # by status_code_conformance instead.
            "positive_data_acceptance": {"enabled": False},
        },
        # ProRL's contract: 503 before /start or with no LLM server, 504 when a job
        # outlives its wait. Any other 5xx there is a failure, as everywhere else.
        "operations": [
            {
                "include-tag": "prorl",
                "checks": {"not_a_server_error": {"expected-statuses": ["1xx", "2xx", "3xx", "4xx", 503, 504]}},
            }
        ],
    }
    if token is not None:
        data["auth"] = {"openapi": {"bearer": {"bearer": token}}}
    return schemathesis.openapi.from_dict(app.openapi(), config=SchemathesisConfig.from_dict(data))


OPEN_APP, GUARDED_APP = _app(None), _app(TOKEN)
open_schema, guarded_schema = _schema(OPEN_APP, None), _schema(GUARDED_APP, TOKEN)


@contextlib.contextmanager
def serving(app, backend: str, token: str | None) -> Iterator[str]:
    """``app`` under uvicorn on a free port (its lifespan starts and stops the service),
    with ``backend`` registered through the API."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="schemathesis-server", daemon=True)
    thread.start()

    def started() -> bool:
        assert thread.is_alive(), "the server's thread ended"
        return server.started

    wait_until(started, 120, "the server to start", interval=0.05)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        served = httpx.get(f"{url}/openapi.json", headers=headers, timeout=30)
        assert served.json() == app.openapi()  # the schema the tests were built from
        added = httpx.post(f"{url}/v1/llm/backends", json={"url": backend, "name": "fake"}, headers=headers, timeout=30)
        assert added.status_code == 201, added.text
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        shutil.rmtree(STATE, ignore_errors=True)
        assert not thread.is_alive(), "the server did not stop"


@pytest.fixture(scope="module")
def llm() -> Iterator[str]:
    fake = FakeVLLM("smollm2", replies=["So it is \\boxed{4}."], latency=0.0).start_in_thread()
    try:
        yield fake.url
    finally:
        fake.stop()


@pytest.fixture(scope="module")
def open_url(llm):
    with serving(OPEN_APP, llm, None) as url:
        yield url


@pytest.fixture(scope="module")
def guarded_url(llm):
    with serving(GUARDED_APP, llm, TOKEN) as url:
        yield url


STREAMS = ("/v1/events", "/v1/status/stream")  # never end without a duration


def _no_long_waits(case) -> None:
    """Long polls and the event streams end quickly (they are bounded, but by minutes)."""
    if case.operation.path in STREAMS and not isinstance(case.query, dict):
        case.query = {}
    if isinstance(case.query, dict):
        for name in ("wait", "duration"):
            try:
                seconds = float(case.query.get(name))
            except (TypeError, ValueError):
                continue
            if seconds > SHORT_WAIT:
                case.query[name] = SHORT_WAIT
        if case.operation.path in STREAMS:
            case.query.setdefault("duration", SHORT_WAIT)
    if case.operation.path == "/v1/rollouts:run" and isinstance(case.body, dict):
        wait = case.body.get("wait")
        if isinstance(wait, (int, float)) and not isinstance(wait, bool) and wait > SHORT_WAIT:
            case.body["wait"] = SHORT_WAIT


SETTINGS = settings(deadline=None, derandomize=True, max_examples=EXAMPLES, suppress_health_check=list(HealthCheck))


def _call(case, url: str, token: str | None) -> None:
    _no_long_waits(case)
    if case.operation.path == "/process":  # started, so jobs get past ProRL's 503
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        httpx.post(f"{url}/start", headers=headers, timeout=30)
    case.call_and_validate(base_url=url)


@open_schema.parametrize()
@SETTINGS
def test_every_operation_without_a_token(case, open_url):
    _call(case, open_url, None)


@guarded_schema.parametrize()
@SETTINGS
def test_every_operation_behind_a_token(case, guarded_url):
    _call(case, guarded_url, TOKEN)
