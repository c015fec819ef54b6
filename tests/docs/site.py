"""Building the docs site (mkdocs.yml at the repository's root) for the tests."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT = 300  # seconds; a build here takes 10-40 s on a loaded 2-core machine


class Build:
    """``mkdocs build --strict`` of ``config`` into ``site``, started in a child process
    (with this checkout's rollserve first on the path: the hooks import it for the HTTP
    reference), so two builds can run side by side; ``result()`` waits for it."""

    def __init__(self, config: Path, site: Path) -> None:
        env = dict(
            os.environ,
            NO_MKDOCS_2_WARNING="1",
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
        )
        self.args = [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(config),
            "--site-dir",
            str(site),
        ]
        # Files, not pipes: a pipe nobody reads yet (the other build's) could fill and block.
        self._out, self._err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        self.began = time.monotonic()
        self.proc = subprocess.Popen(self.args, stdout=self._out, stderr=self._err, stdin=subprocess.DEVNULL, env=env)

    def result(self, timeout: float = BUILD_TIMEOUT) -> subprocess.CompletedProcess[str]:
        """Wait at most ``timeout`` s from the start; past it the build is killed and
        subprocess.TimeoutExpired raised."""
        try:
            self.proc.wait(max(0.0, self.began + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.stop()
            raise
        return subprocess.CompletedProcess(
            self.args, self.proc.returncode, self._read(self._out), self._read(self._err)
        )

    @staticmethod
    def _read(file: IO[bytes]) -> str:
        file.seek(0)
        return file.read().decode(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``config`` into ``site``, waited for."""
    return Build(config, site).result()
