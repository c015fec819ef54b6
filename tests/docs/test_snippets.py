"""Every shell and Python block in README.md and docs/*.md is run by a test or says
why not (tests/docs/snippets.py has the marks). The blocks marked ``runs`` run here:
Python against one live ``rollserve serve`` (a scripted fake vLLM behind it) shared by
the module; a ``console`` transcript's ``$`` commands, their output compared with the
block's; ``rollserve serve`` commands started on a free port, waited for on /healthz
(bounded) and stopped."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rollserve.testing import FakeVLLM
from tests.docs.snippets import MIN_REASON, ROOT, Snippet, all_snippets, snippets_of
from tests.e2e.conftest import ServerProcess

SNIPPETS = all_snippets()
PYTHON = ("python", "py", "python3")
PYTHON_RUNS = [s for s in SNIPPETS if s.kind()[0] == "runs" and s.language in PYTHON]
CONSOLES = [s for s in SNIPPETS if s.kind()[0] == "runs" and s.language == "console"]
SERVERS = [s for s in SNIPPETS if s.kind()[0] == "server"]
DOCS_URL = "http://127.0.0.1:8000"  # the server the docs' snippets talk to
START_TIMEOUT = 180.0  # seconds for a `rollserve serve` to answer /healthz on a loaded host
COMMAND_TIMEOUT = 120.0  # seconds for one command of a console transcript
BOX = re.compile(r"[│╭╮╰╯─]")  # rich's error panel around a message


def _problems(snippet: Snippet) -> list[str]:
    kind, detail = snippet.kind()
    found = []
    if kind == "unmarked":
        found.append(detail)
    elif kind == "not run" and len(detail) < MIN_REASON:
        found.append(f"the reason is too short to say why: {detail!r}")
    elif kind == "run":
        test = ROOT / detail
        if not test.is_file():
            found.append(f"{detail} does not exist")
        elif Path(snippet.page).name not in test.read_text():
            found.append(f"{detail} never names {Path(snippet.page).name}: it cannot read this block")
    elif kind == "runs" and snippet.language not in (*PYTHON, "console"):
        found.append(
            "python and console blocks are run here; mark a shell block "
            "`runs: server` (one `rollserve serve`), make it a console transcript, or `not run: why`"
        )
    elif kind == "server" and shlex.split(snippet.code, comments=True)[:2] != ["rollserve", "serve"]:
        found.append("`runs: server` is for one `rollserve serve` command")
    for path in re.findall(r"\b(?:tests|examples|scripts|benchmarks)/[\w/.-]*\w", detail):
        if not (ROOT / path).exists():
            found.append(f"its mark names {path}, which does not exist")
    return [f"{snippet.id}: {p}" for p in found]


def test_every_snippet_is_run_or_says_why() -> None:
    problems = [p for s in SNIPPETS for p in _problems(s)]
    assert not problems, "\n".join(problems)
    assert PYTHON_RUNS and CONSOLES and SERVERS  # the runners below have blocks to run


def test_an_unmarked_block_and_a_reason_that_says_nothing_are_caught() -> None:
    page = (
        "text\n\n```bash\nls\n```\n\n<!-- not run: no -->\n```python\n1\n```\n"
        "<!-- runs -->\n```python\nprint(1)\n```\n```json\n{}\n```\n"
        "<!-- run: tests/nowhere.py -->\n```sh\nls\n```\n"
    )
    snippets = snippets_of(page, "docs/p.md")
    assert [s.kind()[0] for s in snippets] == ["unmarked", "not run", "runs", "run"]
    assert [bool(_problems(s)) for s in snippets] == [True, True, False, True]


def test_a_bare_fence_is_caught_and_text_is_not_checked() -> None:
    """A fence without a language fails even with a mark (so no block dodges the check
    by dropping its tag); ``text`` is output or a diagram, not run; a block indented
    under a list item is read like one at the margin, without the indent."""
    page = (
        "```\nrollserve harness install codex\n```\n\n<!-- runs -->\n```\nls\n```\n\n"
        "```text\ntrainer -> rollserve\n```\n\n- an item:\n\n    ```bash\n    ls\n    ```\n\n"
        "- another:\n\n    <!-- runs -->\n    ```python\n    if True:\n        print(1)\n    ```\n"
    )
    snippets = snippets_of(page, "docs/p.md")
    assert [(s.line, s.language, s.kind()[0]) for s in snippets] == [
        (1, "", "unmarked"),
        (6, "", "unmarked"),
        (16, "bash", "unmarked"),
        (23, "python", "runs"),
    ]
    assert all(_problems(s) for s in snippets[:3]) and not _problems(snippets[3])
    assert "no language" in snippets[1].kind()[1]
    assert snippets[3].code == "if True:\n    print(1)\n"


SERVE_TEST = "test_serve_snippet_starts_and_stops"


@pytest.fixture(scope="module")
def launched(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[dict[str, ServerProcess]]:
    """The module's `rollserve serve` processes, launched side by side (each is mostly
    imports: the cores start them together rather than one after the other): the live
    server the Python snippets talk to ("live": its policy a scripted fake vLLM that
    answers every math question right), and each selected ``runs: server`` block's
    command as written, on a free port and a scratch state folder (by snippet id). Each
    test waits (bounded) for its own; all are stopped at the end."""
    selected = {item.name for item in request.session.items}
    servers: dict[str, ServerProcess] = {}
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")
        env.setenv("TOKENIZERS_PARALLELISM", "false")
        env.delenv("ROLLSERVE_API_TOKEN", raising=False)
        fake = FakeVLLM("smollm2", replies=lambda ids, text: "It is \\boxed{42}.").start_in_thread()
        try:
            if any(
                name.startswith(("test_python_snippet_runs[", "test_console_snippet_prints_what_it_shows["))
                for name in selected
            ):
                servers["live"] = ServerProcess(
                    tmp_path_factory.mktemp("docs-server"), ["--backend", fake.url]
                ).launch()
            for snippet in SERVERS:
                if f"{SERVE_TEST}[{snippet.id}]" in selected:
                    args = _without_port_and_state(shlex.split(snippet.code, comments=True)[2:])
                    servers[snippet.id] = ServerProcess(tmp_path_factory.mktemp("serve") / "state", args).launch()
            yield servers
        finally:
            for server in servers.values():
                server.stop()
            fake.stop()


@pytest.fixture
def live(launched: dict[str, ServerProcess]) -> ServerProcess:
    """One `rollserve serve` for every Python snippet (launched with the module's others)."""
    if "live" not in launched:
        pytest.fail("the live server was not launched: no Python snippet test was collected?")
    return launched["live"].wait_ready(START_TIMEOUT)


@pytest.mark.parametrize("snippet", PYTHON_RUNS, ids=[s.id for s in PYTHON_RUNS])
def test_python_snippet_runs(
    snippet: Snippet, live: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As written, but for the server's URL, in a scratch folder."""
    monkeypatch.chdir(tmp_path)
    code = snippet.code.replace(DOCS_URL, live.url)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, snippet.id, "exec"), {"__name__": "__snippet__"})
    if "print(" in code:
        assert printed.getvalue().strip(), f"{snippet.id} printed nothing"


@pytest.mark.parametrize("snippet", SERVERS, ids=[s.id for s in SERVERS])
def test_serve_snippet_starts_and_stops(snippet: Snippet, launched: dict[str, ServerProcess]) -> None:
    """The command as written, on a free port and a scratch state folder (launched by
    the module's fixture, side by side with the others): it answers /healthz, then stops."""
    server = launched.get(snippet.id)
    assert server is not None, f"{snippet.id}: its server was not launched"
    try:
        server.wait_ready(START_TIMEOUT)
        health = httpx.get(f"{server.url}/healthz", timeout=10)
        assert health.status_code == 200 and health.json()["ok"] is True
    finally:
        server.stop()
    assert server.proc is not None and server.proc.returncode is not None


def _without_port_and_state(args: list[str]) -> list[str]:
    """The test picks the port and the state folder."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("--port", "--state-dir"):
            skip = True
        elif not arg.startswith(("--port=", "--state-dir=")):
            out.append(arg)
    return out


def _plain(text: str) -> str:
    return " ".join(BOX.sub(" ", text).split())


def _transcript(code: str) -> list[tuple[str, str]]:
    """A console block as (command, the output shown after it)."""
    steps: list[tuple[str, list[str]]] = []
    for line in code.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
    return [(command, "\n".join(shown)) for command, shown in steps]


@pytest.mark.parametrize("snippet", CONSOLES, ids=[s.id for s in CONSOLES])
def test_console_snippet_prints_what_it_shows(snippet: Snippet, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Each ``$`` command run in a scratch folder (``rollserve`` is this checkout's), its
    output holding the lines shown (rich's panel borders and line breaks aside). A
    transcript that names ``http://127.0.0.1:8000`` talks to the live server the Python
    blocks use (the URL replaced by its own)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "rollserve"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m rollserve.cli "$@"\n')
    shim.chmod(0o755)
    steps = _transcript(snippet.code)
    assert steps, f"{snippet.id}: a console block without a `$ ` command"
    if DOCS_URL in snippet.code:
        url = request.getfixturevalue("live").url
        steps = [(command.replace(DOCS_URL, url), shown) for command, shown in steps]
    for command, shown in steps:
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
            env={
                **os.environ,
                "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                "COLUMNS": "80",
                "HF_HUB_OFFLINE": "1",
            },
        )
        assert _plain(shown) in _plain(done.stdout + done.stderr), (command, done.stdout, done.stderr)
