"""The IPython tool on every runtime: state, tracebacks, images, timeouts."""

from __future__ import annotations

import base64
import importlib.util
import time

import pytest

from rollserve.handlers.sandboxed import find_python
from rollserve.sandbox.base import SandboxError
from rollserve.sandbox.tools.ipython import IPythonConfig, IPythonSession

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


_FOUND: dict[str, IPythonConfig | None] = {}  # per runtime: probing costs ~0.5 s


@pytest.fixture
async def ipython_config(sandbox):
    if sandbox.runtime not in _FOUND:
        _FOUND[sandbox.runtime] = await _find_python(sandbox)
    if _FOUND[sandbox.runtime] is None:
        pytest.skip(f"no python with IPython runs inside the {sandbox.runtime} sandbox here")
    return _FOUND[sandbox.runtime]


async def _find_python(sandbox) -> IPythonConfig | None:
    """The python the python tool gets in this sandbox (``find_python``: the sandboxes'
    own Python on bubblewrap, this server's on local); None where none runs."""
    try:
        return await find_python(sandbox, IPythonConfig(timeout=5, interrupt_grace=2))
    except SandboxError:
        return None


@pytest.fixture
async def kernel(sandbox, ipython_config):
    async with IPythonSession(sandbox, ipython_config) as session:
        yield session


async def test_state_persists_across_cells(kernel):
    assert (await kernel.run("x = 40\ndef double(v):\n    return 2 * v")).ok
    result = await kernel.run("double(x) + 2")
    assert result.ok and result.result == "82" and result.execution_count == 2
    assert "Out[2]: 82" in result.to_text()


async def test_stdout_stderr_and_subprocess_output_are_captured(kernel):
    result = await kernel.run(
        "import sys, os\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\nos.system('echo from a subprocess')"
    )
    assert result.stdout == "to stdout\nfrom a subprocess\n"
    assert result.stderr == "to stderr\n"
    assert result.result == "0"  # os.system's return value


async def test_traceback_is_plain_text(kernel):
    result = await kernel.run("def f():\n    return 1 / 0\nf()")
    assert not result.ok and result.error_name == "ZeroDivisionError"
    assert "ZeroDivisionError: division by zero" in result.error
    assert "return 1 / 0" in result.error and "\x1b" not in result.error
    syntax = await kernel.run("def broken(:")
    assert syntax.error_name == "SyntaxError" and "SyntaxError" in syntax.error
    assert (await kernel.run("'still alive'")).result == "'still alive'"


async def test_input_cannot_read_the_protocol(kernel):
    result = await kernel.run("input('x? ')")
    assert not result.ok  # stdin is /dev/null: EOFError or StdinNotImplementedError
    assert (await kernel.run("1 + 1")).result == "2"


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib is not installed")
async def test_matplotlib_figure_comes_back_as_base64_png(kernel):
    result = await kernel.run("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.title('t')\nNone")
    assert result.ok and len(result.images) == 1
    assert base64.b64decode(result.images[0]).startswith(PNG_MAGIC)
    assert "[1 image(s) returned as PNG]" in result.to_text()
    assert (await kernel.run("1")).images == []  # figures are flushed once


@pytest.mark.skipif(importlib.util.find_spec("PIL") is None, reason="pillow is not installed")
async def test_pil_image_result_comes_back_as_png(kernel):
    result = await kernel.run("from PIL import Image\nImage.new('RGB', (8, 8), 'red')")
    assert result.ok and len(result.images) == 1
    assert base64.b64decode(result.images[0]).startswith(PNG_MAGIC)


async def test_timeout_interrupts_the_cell_and_keeps_the_kernel(kernel):
    await kernel.run("kept = 'yes'")
    started = time.monotonic()
    result = await kernel.run("import time\nwhile True:\n    time.sleep(0.05)", timeout=0.5)
    assert result.timed_out and not result.kernel_lost
    assert result.error_name == "KeyboardInterrupt"
    assert time.monotonic() - started < 10  # bounded (the cell loops forever)
    assert "interrupted" in result.to_text()
    assert (await kernel.run("kept")).result == "'yes'"


async def test_a_cell_that_ignores_interrupts_loses_the_kernel(sandbox, ipython_config):
    config = ipython_config.model_copy(update={"interrupt_grace": 0.5})
    async with IPythonSession(sandbox, config) as kernel:
        await kernel.run("gone = 1")
        result = await kernel.run(
            "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(30)", timeout=0.5
        )
        assert result.timed_out and result.kernel_lost
        assert "restarted" in result.to_text()
        after = await kernel.run("'gone' in globals()")
        assert after.result == "False" and "new kernel" in after.to_text()


async def test_huge_output_is_truncated(sandbox, ipython_config):
    config = ipython_config.model_copy(update={"max_output_bytes": 1000})
    async with IPythonSession(sandbox, config) as kernel:
        result = await kernel.run("for i in range(100000):\n    print(i)")
    assert result.truncated and result.stdout.startswith("0\n1\n")
    assert result.stdout.rstrip().endswith("99999") and "dropped" in result.stdout


async def test_the_kernel_leaves_the_workspace_clean(sandbox, kernel):
    """IPython's and matplotlib's state goes to the private tmp, never the workspace
    (whatever $HOME is: an image may set it to the workspace)."""
    await kernel.run("x = 1")
    if importlib.util.find_spec("matplotlib") is not None:
        await kernel.run("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nNone")
    assert sorted(p.name for p in sandbox.workspace.iterdir()) == []
