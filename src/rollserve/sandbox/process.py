"""Host processes behind every sandbox: a launcher command on pipes or on a fresh PTY.

Every runtime ends up starting a host command (``bwrap ... -- bash``, ``docker exec
...``, or the command itself for ``local``). ``HostProcess`` owns that command:

- it is started with ``subprocess.Popen`` without ``preexec_fn``, so CPython uses
  ``vfork`` (fast even from a big server process); limits are applied by the runtime
  (``prlimit`` in front of the command, or ``resource.prlimit`` on a blocked bwrap);
- it runs in its own process group (a new session), so one ``killpg`` reaches it and
  everything it forked that did not leave the group;
- its output is read through the event loop (``loop.add_reader`` on non-blocking
  fds): ``read()`` returns the moment bytes arrive, nothing polls;
- its exit is seen through a pidfd on the same loop, so ``wait()`` is event-driven
  and bounded.

It must be started from the event loop's thread: runtimes use ``PR_SET_PDEATHSIG``
(bwrap ``--die-with-parent``), which fires when the *thread* that forked exits, so a
process forked from a short-lived executor thread would be killed with that thread.

One-shot commands (``collect``, ``run_command``) are host.py.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import signal as signals
import struct
import subprocess
import termios
from collections.abc import Callable, Sequence
from typing import Self

import psutil

from rollserve.sandbox.base import SandboxProcess

READ_CHUNK = 1 << 16
KILL_WAIT = 5.0
# Signals a terminal sends (^C, ^\\): an interrupted command must get them.
_TERMINAL_SIGNALS = (signals.SIGINT, signals.SIGQUIT)


def _ignore(signum: int, frame: object) -> None:
    """Does nothing: the handler that stands for an inherited ``SIG_IGN``."""


def hand_down_default_signals() -> None:
    """Let the commands this process starts get ^C and ^\\ with their default action.

    A process started with SIGINT or SIGQUIT ignored (a background job of a shell
    script: ``rollserve serve &`` in a batch job, ``nohup ... &``) hands that to every
    command it starts, since an ignored signal stays ignored across ``exec``: a
    sandbox's interrupted command would not stop at ^C, and only the kill that follows
    would end it. A handled signal goes back to its default at ``exec``, so each
    ignored one here gets a handler that does nothing (this process still does not
    react to it). Only the main thread may set handlers: elsewhere nothing changes."""
    for signum in _TERMINAL_SIGNALS:
        if signals.getsignal(signum) == signals.SIG_IGN:
            try:
                signals.signal(signum, _ignore)
            except ValueError:  # not the main thread
                return


class HostProcess(SandboxProcess):
    """A host command on pipes (stdout and stderr merged or separate) or on a PTY."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        stdin_fd: int | None,
        out_fd: int,
        err_fd: int | None,
        pty: bool,
        contained: bool = False,
    ) -> None:
        self._popen = popen
        # contained: the launcher holds everything it starts (bwrap: a PID namespace
        # that dies with it); else kill() also hunts the process's descendants.
        self.contained = contained
        self.pid = popen.pid
        self.pty = pty
        self._stdin_fd = stdin_fd  # for a PTY: the master (same fd as out_fd)
        self._out_fd: int | None = out_fd
        self._err_fd = err_fd
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = self._loop.create_future()
        self.cap: str | None = None  # the sandbox cap that killed it ("disk", "memory")
        self._notice = b""  # why, read once at the end of its output (see kill_for_cap)
        self._notice_on_stderr = err_fd is not None
        self._closed = False
        # pending fd waits: future -> (fd, the loop's remove_reader / remove_writer)
        self._waiters: dict[asyncio.Future[None], tuple[int, Callable[[int], object]]] = {}
        self._watch_exit()

    # -- starting -------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        *,
        pty: bool = False,
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        merge_stderr: bool = True,
        new_session: bool = True,
        pass_fds: Sequence[int] = (),
        window: tuple[int, int] = (50, 250),
        contained: bool = False,
    ) -> Self:
        """Start ``argv`` on the host. Call from the event loop thread (see module doc).

        ``new_session=False`` is for a PTY command that makes itself a session leader
        with the PTY as controlling terminal (``setsid --ctty cmd``): util-linux
        ``setsid`` forks (and the pid we hold exits) when it already leads a group."""
        hand_down_default_signals()
        child_fds: list[int] = []  # the child's ends: closed here once it has them
        parent_fds: list[int] = []  # ours: closed here only if the start fails

        try:
            if pty:
                master, slave = os.openpty()
                parent_fds.append(master)
                child_fds.append(slave)
                # A wide window keeps long command lines from being wrapped (and echoed
                # back with carriage returns) by the terminal.
                fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", *window, 0, 0))
                stdin = stdout = stderr = slave
                ours: tuple[int, int, int | None] = (master, master, None)
            else:
                in_r, in_w = os.pipe2(os.O_CLOEXEC)
                parent_fds.append(in_w)
                child_fds.append(in_r)
                out_r, out_w = os.pipe2(os.O_CLOEXEC)
                parent_fds.append(out_r)
                child_fds.append(out_w)
                stdin, stdout, stderr, err_r = in_r, out_w, subprocess.STDOUT, None
                if not merge_stderr:
                    err_r, stderr = os.pipe2(os.O_CLOEXEC)
                    parent_fds.append(err_r)
                    child_fds.append(stderr)
                ours = (in_w, out_r, err_r)
            popen = subprocess.Popen(
                list(argv),
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                env=env,
                cwd=cwd,
                close_fds=True,
                pass_fds=tuple(pass_fds),
                start_new_session=new_session,
            )
        except BaseException:
            for fd in parent_fds:
                os.close(fd)
            raise
        finally:
            for fd in child_fds:
                os.close(fd)
        for fd in parent_fds:
            os.set_blocking(fd, False)
        return cls(popen, ours[0], ours[1], ours[2], pty, contained)

    def _watch_exit(self) -> None:
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # no pidfd (old kernel): a thread blocks on wait

            async def wait_in_thread() -> None:
                code = await asyncio.to_thread(self._popen.wait)
                if not self._exited.done():
                    self._exited.set_result(code)

            asyncio.ensure_future(wait_in_thread())
            return

        def on_exit() -> None:
            # The pidfd turns readable when the process is a zombie, before it is
            # reaped: its pid (= its group id) cannot be reused yet, so killing the
            # group now reaches exactly what it left behind and nothing else.
            self._killpg(signals.SIGKILL)
            code = self._popen.poll()  # reaps the zombie
            if code is None:
                return
            self._loop.remove_reader(pidfd)
            os.close(pidfd)
            if not self._exited.done():
                self._exited.set_result(code)

        self._loop.add_reader(pidfd, on_exit)

    # -- talking ----------------------------------------------------------------------

    async def _wait_fd(self, fd: int, writable: bool) -> None:
        ready: asyncio.Future[None] = self._loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        add, remove = (
            (self._loop.add_writer, self._loop.remove_writer)
            if writable
            else (self._loop.add_reader, self._loop.remove_reader)
        )
        add(fd, wake)
        self._waiters[ready] = (fd, remove)
        try:
            await ready
        finally:
            if self._waiters.pop(ready, None) is not None:
                remove(fd)

    async def _read_fd(self, fd: int | None, max_bytes: int) -> bytes:
        while True:
            if fd is None or self._closed:
                return b""
            try:
                return os.read(fd, max_bytes)
            except BlockingIOError:
                pass
            except OSError as error:
                # A PTY master reads EIO once every slave end is closed: end of output.
                if error.errno == errno.EIO:
                    return b""
                raise
            await self._wait_fd(fd, writable=False)

    async def read(self, max_bytes: int = READ_CHUNK) -> bytes:
        data = await self._read_fd(self._out_fd, max_bytes)
        return data or (b"" if self._notice_on_stderr else self._take_notice())

    async def read_stderr(self, max_bytes: int = READ_CHUNK) -> bytes:
        """stderr, when started with ``merge_stderr=False`` (else b"" at once)."""
        if not self._notice_on_stderr:
            return b""
        return await self._read_fd(self._err_fd, max_bytes) or self._take_notice()

    def _take_notice(self) -> bytes:
        notice, self._notice = self._notice, b""
        return notice

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._stdin_fd is None or self._closed:
                raise BrokenPipeError("stdin of the process is closed")
            try:
                written = os.write(self._stdin_fd, view)
                view = view[written:]
            except BlockingIOError:
                await self._wait_fd(self._stdin_fd, writable=True)

    def close_stdin(self) -> None:
        """End of input for a pipe process (a PTY has no separate stdin to close)."""
        if self.pty or self._stdin_fd is None:
            return
        fd, self._stdin_fd = self._stdin_fd, None
        for ready, (waited_fd, remove) in list(self._waiters.items()):
            if waited_fd == fd:
                del self._waiters[ready]
                remove(fd)
                if not ready.done():
                    ready.set_result(None)
        os.close(fd)

    def resize(self, rows: int, cols: int) -> None:
        if self.pty and self._out_fd is not None:
            fcntl.ioctl(self._out_fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    # -- lifetime ---------------------------------------------------------------------

    @property
    def returncode(self) -> int | None:
        """Exit status once exited (negative: killed by that signal), else None."""
        return self._exited.result() if self._exited.done() else None

    def signal(self, signum: int) -> None:
        if not self._exited.done():
            self._killpg(signum)

    def _killpg(self, signum: int) -> None:
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            # Not (yet) a group leader: a `setsid` wrapper that has not run yet.
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass
        except PermissionError:
            # The group holds a process we may not signal (it changed uid); the
            # process itself is ours.
            os.kill(self.pid, signum)

    def signal_foreground(self, signum: int) -> bool:
        """Signal the foreground process group of this process's terminal, unless it is
        the shell's own (a builtin loop: C-c handles that, and killing it would kill
        the shell). True if a group was signalled.

        Asks the kernel through our PTY master: ``tcgetpgrp`` and ``TIOCGSID`` answer
        for the terminal, with ids as seen from the host (a sandbox's PID namespace
        included). False on pipes, or when the terminal has no foreground job.
        """
        fd = self._out_fd
        if not self.pty or fd is None or self._exited.done():
            return False
        try:
            foreground = os.tcgetpgrp(fd)
            tiocgsid = getattr(termios, "TIOCGSID", 0x5429)  # Linux's value; Python lacks the name
            session = struct.unpack("i", fcntl.ioctl(fd, tiocgsid, b"\0\0\0\0"))[0]
            if foreground <= 0 or foreground == session:
                return False
            os.killpg(foreground, signum)
            return True
        except OSError:
            return False

    def on_exit(self, callback: Callable[[HostProcess], object]) -> None:
        """Call ``callback(self)`` once the process has exited (and been reaped)."""
        self._exited.add_done_callback(lambda _: callback(self))

    async def wait(self, timeout: float | None = None) -> int | None:
        try:
            return await asyncio.wait_for(asyncio.shield(self._exited), timeout)
        except TimeoutError:
            return None

    def kill_now(self) -> None:
        """SIGKILL the process, its group and (unless contained) its descendants,
        without waiting (for ``finally`` blocks of cancelled tasks)."""
        if self._exited.done():
            return
        if not self.contained:
            # Job-control shells put background jobs in groups of their own: find
            # them (and anything else it forked) before the parent links are lost.
            for child in _descendants(self.pid):
                try:
                    child.kill()  # psutil checks pid + start time: never a reused pid
                except psutil.Error:
                    pass
        self.signal(signals.SIGKILL)

    def kill_for_cap(self, cap: str, notice: str) -> None:
        """Kill it because its sandbox passed a cap: whoever reads its output (stderr if
        separate, else stdout or the PTY) gets ``notice`` before the end of it, so the
        agent learns why (tools need not know about caps)."""
        if self._exited.done():
            return
        self.cap = cap
        self._notice = notice.encode()
        self.kill_now()

    async def kill(self, close: bool = True) -> None:
        """Kill (see ``kill_now``) and wait for it; then close our fds unless
        ``close=False`` (to drain output still buffered in the pipes)."""
        self.kill_now()
        if await self.wait(KILL_WAIT) is None:  # pragma: no cover - D state, or not ours
            raise TimeoutError(f"process {self.pid} did not die within {KILL_WAIT}s of SIGKILL")
        if close:
            self.close()

    def close(self) -> None:
        """Close our ends of the pipes / the PTY master (the process is not touched);
        pending reads return b"", pending writes raise BrokenPipeError."""
        if self._closed:
            return
        self._closed = True
        # Unregister before closing: the fd number may be reused at once by others.
        waiters, self._waiters = self._waiters, {}
        for ready, (waited_fd, remove) in waiters.items():
            remove(waited_fd)
            if not ready.done():
                ready.set_result(None)
        for fd in {self._stdin_fd, self._out_fd, self._err_fd}:
            if fd is None:
                continue
            try:
                os.close(fd)
            except OSError:
                pass
        self._stdin_fd = self._out_fd = self._err_fd = None


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
