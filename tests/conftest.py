"""Fixtures shared by every test folder."""

from __future__ import annotations

import ast
import asyncio
import os
import time
from collections.abc import Generator
from pathlib import Path

import httpx
import pytest

from rollserve.api.app import create_app
from rollserve.engine.pipeline import EngineConfig
from rollserve.llm.tokens.tokenizer import ChatTokenizer
from rollserve.server import ServerConfig, Service
from rollserve.testing import FakeVLLM
from tests import early_start
from tests.real_vllm import FIXTURES, Pending, skip_reason

# --- the `slow` mark --------------------------------------------------------------------------
# Plain `pytest` (CI, the README's command) runs every test; `pytest -m "not slow"` is the
# development loop. The mark is given here, by where a test is and what it uses, so no test
# file carries it: whole-service processes, the embedded model, a real vLLM, killed and
# restarted processes, suites re-run as another user, generated-input and SWE-repository runs.
SLOW_DIRS = {
    "tests/e2e/": "a whole `rollserve serve` process driven over HTTP",
    "tests/cluster/": "a Ray cluster of four raylets and a `rollserve serve --ray` process",
}
SLOW_MARKS = {"embedded": "the embedded model", "vllm": "a real vLLM server"}
SLOW_FIXTURES = {"server_factory": "starts `rollserve serve` processes"}
SLOW_TESTS = {  # a file, or a test in it (with all its parameters)
    "tests/docs/test_site.py": "builds the docs site with mkdocs, twice (tens of seconds each)",
    "tests/docs/test_snippets.py::test_python_snippet_runs": "the docs' Python against a live server",
    "tests/docs/test_snippets.py::test_serve_snippet_starts_and_stops": "starts server processes",
    "tests/docs/test_snippets.py::test_console_snippet_prints_what_it_shows": "runs the docs' commands",
    "tests/api/test_schemathesis.py": "hundreds of generated requests to two live servers",
    "tests/handlers/swe/test_swe_handler.py": "repositories cloned into sandboxes and their test suites run",
    "tests/handlers/swe/test_swe_results.py": "pytest runs of a repository's tests in sandboxes (about 40 s)",
    "tests/handlers/swe/test_swe_mini_data.py::test_build_check_is_up_to_date": (
        "rebuilds and re-verifies every swe-mini instance"
    ),
    "tests/handlers/test_scoring.py::test_no_process_outlives_a_killed_server": "kills a server process",
    "tests/sandbox/test_owner.py::test_sigkilled_server_leaves_nothing_and_a_live_servers_sandbox_stays": (
        "kills a server process and reaps after it"
    ),
    "tests/sandbox/test_caps.py::test_caps_as_an_unprivileged_user": "re-runs the caps suite as another user",
    "tests/sandbox/test_escape.py::test_escape_suite_as_an_unprivileged_user": (
        "re-runs the escape suite as another user"
    ),
    "tests/test_packaging.py": "pip installs the package into a fresh venv",
    "tests/integrations/test_verl_loop.py": (
        "builds (once, cached) a venv with verl and runs its agent loop on a live server"
    ),
    "tests/testing/test_fake_vllm.py::test_command_line_entry_serves": "starts a server process",
    "tests/testing/test_scripted_policy.py::test_fake_llm_script_drives_rollouts_per_task": "starts a server process",
}
ROOT = Path(__file__).resolve().parent.parent


def slow_reason(item: pytest.Item) -> str | None:
    """Why ``item`` is slow, or None."""
    for prefix, reason in SLOW_DIRS.items():
        if item.nodeid.startswith(prefix):
            return reason
    for entry, reason in SLOW_TESTS.items():
        if item.nodeid == entry or item.nodeid.startswith((entry + "::", entry + "[")):
            return reason
    for mark, reason in SLOW_MARKS.items():
        if item.get_closest_marker(mark) is not None:
            return reason
    if isinstance(item, pytest.Function):
        for fixture, reason in SLOW_FIXTURES.items():
            if fixture in item.fixturenames:
                return reason
    return None


def _check_slow_table() -> None:
    """A renamed file or test must not quietly fall out of the table (and run as fast)."""
    for entry in (*SLOW_DIRS, *SLOW_TESTS):
        path, _, test = entry.partition("::")
        if not (ROOT / path).exists():
            raise pytest.UsageError(f"tests/conftest.py: slow entry {entry!r}: no such file")
        if test and not any(
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == test
            for node in ast.walk(ast.parse((ROOT / path).read_text()))
        ):
            raise pytest.UsageError(f"tests/conftest.py: slow entry {entry!r}: no such test")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by mark
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _check_slow_table()
    for item in items:
        reason = slow_reason(item)
        if reason is not None:
            item.add_marker(pytest.mark.slow(reason=reason))
    if config.stash[_PENDING_VLLM] is not None:
        # The real vLLM is still starting (tests/real_vllm.py): the tests that need it
        # go last, in their order, so the rest of the suite runs meanwhile.
        items[:] = [item for item in items if not needs_vllm(item)] + [item for item in items if needs_vllm(item)]


# --- the real vLLM server (tests/real_vllm.py) --------------------------------------------------
_PENDING_VLLM = pytest.StashKey[Pending | None]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_PENDING_VLLM] = Pending.from_env()


def needs_vllm(item: pytest.Item) -> bool:
    """Marked `vllm`, or asking for the server's URL."""
    return item.get_closest_marker("vllm") is not None or (
        isinstance(item, pytest.Function) and any(f in item.fixturenames for f in FIXTURES)
    )


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outside pytest-timeout's per-test timer
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    pending = item.config.stash[_PENDING_VLLM]
    if pending is not None and not pending.done and needs_vllm(item):
        reporter = item.config.pluginmanager.get_plugin("terminalreporter")
        say = reporter.write_line if reporter is not None else print
        say(f"\nwaiting (at most {pending.wait:g} s) for the vLLM server being started for this run ({pending.path})")
        began = time.monotonic()
        pending.wait_for_it()
        outcome = pending.error or "up: " + ", ".join(f"{k}={v}" for k, v in pending.found.items())
        say(f"vLLM server after {time.monotonic() - began:.0f} s of waiting: {outcome}")
    return (yield)


def _real_vllm(config: pytest.Config, var: str) -> str:
    pending = config.stash[_PENDING_VLLM]
    if pending is not None:
        pending.wait_for_it()  # done already, unless something reordered the tests
    reason = skip_reason(var, pending)
    if reason is not None:
        pytest.skip(reason)
    return os.environ[var]


@pytest.fixture(scope="session")
def vllm_url(request: pytest.FixtureRequest) -> str:
    """The real vLLM server's URL (ROLLSERVE_VLLM_URL); skips, saying why, without one."""
    return _real_vllm(request.config, "ROLLSERVE_VLLM_URL")


@pytest.fixture(scope="session")
def vllm_lora_url(request: pytest.FixtureRequest) -> str:
    """A real vLLM server with runtime LoRA loading (ROLLSERVE_VLLM_LORA_URL); skips,
    saying why, without one."""
    return _real_vllm(request.config, "ROLLSERVE_VLLM_LORA_URL")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    pending = terminalreporter.config.stash[_PENDING_VLLM]
    if pending is not None and pending.error is not None:
        terminalreporter.write_sep(
            "#", "WARNING: the real-vLLM tests (marked 'vllm') were SKIPPED", red=True, bold=True
        )
        terminalreporter.write_line(f"reason: {pending.error}")


# --- commands started when the session starts (tests/early_start.py) -------------------------
def pytest_collection_finish(session: pytest.Session) -> None:
    if not session.config.option.collectonly:
        early_start.start_for(item.nodeid for item in session.items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    early_start.stop_all()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With exactly ``-m "not slow"``, a folder or file whose tests are all slow is not
    even imported (its tests would be deselected anyway): collecting e2e/ and the
    schemathesis suite alone takes seconds."""
    if "".join(str(config.getoption("markexpr") or "").split()) != "notslow":
        return None
    try:
        path = collection_path.relative_to(ROOT).as_posix()
    except ValueError:
        return None
    path += "/" if collection_path.is_dir() else ""
    whole = [*SLOW_DIRS, *(entry for entry in SLOW_TESTS if "::" not in entry)]
    return True if any(path.startswith(entry) for entry in whole) else None


@pytest.fixture(scope="session")
def tok() -> ChatTokenizer:
    """The real SmolLM2 ChatML tokenizer (read from the GGUF once, then cached)."""
    return ChatTokenizer.load("smollm2")


@pytest.fixture
def chat_prompt(tok):
    def make(text: str = "What is 2+2?") -> list[int]:
        rendered = tok.render([{"role": "user", "content": text}], add_generation_prompt=True)
        return tok.encode(rendered)

    return make


@pytest.fixture
async def loop_gaps():
    """Seconds between ticks of a 10 ms heartbeat on the event loop while the test
    runs: a blocked loop shows up as a long gap."""
    gaps: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(tick())
    yield gaps
    task.cancel()


@pytest.fixture
async def fake_llm():
    async with FakeVLLM("smollm2", replies=["Adding them: \\boxed{4}"], latency=0.01) as server:
        yield server


@pytest.fixture
async def make_api(tmp_path):
    """Build a service + in-process HTTP client; pass backends=[url] or none,
    ``prorl=ProRLConfig(...)`` to serve ProRL Agent's routes too, ``server={...}`` for
    other ServerConfig settings, and EngineConfig's as keywords."""
    made = []

    async def make(backends=(), token=None, prorl=None, server=None, **engine):
        config = ServerConfig(
            state_dir=tmp_path / f"state{len(made)}",
            api_token=token,
            backends=list(backends),
            engine=EngineConfig(**engine),
            **(server or {}),
        )
        service = Service(config)
        await service.start()
        app = create_app(service, manage_lifecycle=False, prorl=prorl)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://rollserve", timeout=30)
        made.append((service, client))
        return service, client

    yield make
    for service, client in made:
        await client.aclose()
        await service.stop()


_IPYTHON_PROBE: dict[str, str | None] = {}  # probed once per test session


@pytest.fixture
async def ipython_in_bubblewrap(tmp_path):
    """Skip (saying why) where no python with IPython can run inside a bubblewrap
    sandbox: e.g. a root server whose interpreter and packages live under /root, which
    sandboxes (running as a uid of their own) cannot reach."""
    from rollserve.handlers.sandboxed import find_python
    from rollserve.sandbox.base import SandboxError, SandboxSpec
    from rollserve.sandbox.bubblewrap import BubblewrapRuntime

    reason = BubblewrapRuntime.unavailable_reason()
    if reason is None and "bubblewrap" not in _IPYTHON_PROBE:
        async with await BubblewrapRuntime(state_dir=tmp_path).start(SandboxSpec()) as box:
            try:
                await find_python(box)
                _IPYTHON_PROBE["bubblewrap"] = None
            except SandboxError as error:
                _IPYTHON_PROBE["bubblewrap"] = str(error)
    reason = reason or _IPYTHON_PROBE.get("bubblewrap")
    if reason:
        pytest.skip(f"the python tool cannot run here: {reason}")
