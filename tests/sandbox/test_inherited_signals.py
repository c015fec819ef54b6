"""A server started with ^C and ^\\ ignored (a background job of a shell script:
``rollserve serve &`` in a batch job) does not hand that to its sandboxes: their
commands start with SIGINT and SIGQUIT at their defaults, so an interrupted command
stops at ^C. Checked in a child Python started the way such a shell starts it."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import asyncio, signal
signal.signal(signal.SIGINT, signal.SIG_IGN)  # what `cmd &` in a script does
signal.signal(signal.SIGQUIT, signal.SIG_IGN)
from rollserve.sandbox.process import HostProcess

async def main():
    process = HostProcess.start(["sh", "-c", "grep SigIgn /proc/$$/status"], pty=PTY)
    out = b""
    while chunk := await process.read():
        out += chunk
    await process.wait()
    print(out.decode().split()[-1])
    print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN, signal.getsignal(signal.SIGQUIT) is signal.SIG_IGN)

asyncio.run(main())
"""


def test_sandbox_commands_get_interrupts_even_when_the_server_ignores_them():
    for pty in (False, True):
        out = subprocess.run(
            [sys.executable, "-c", CHILD.replace("PTY", str(pty))], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        mask_line, still_ignored = out.stdout.split("\n")[:2]
        mask = int(mask_line.strip(), 16)
        assert mask & (1 << (2 - 1)) == 0 and mask & (1 << (3 - 1)) == 0, f"SIGINT/SIGQUIT ignored: {mask:#x}"
        assert still_ignored == "False False"  # the server: a handler that does nothing, not SIG_IGN
