"""How the bash tool talks to bash through a terminal: the command line it types,
the prompt marker it waits for, the job notices it keeps out of later output, and
the last-resort kill of the foreground job.

Kept apart from the session logic (bash.py) because this is the part that must be
exactly right byte for byte, and is tested on its own.
"""

from __future__ import annotations

import re

from rollserve.sandbox.base import SandboxProcess
from rollserve.sandbox.tools.text import HeadTail

LINE_LIMIT = 4000  # bytes per line written; the kernel's canonical line holds 4095
RS = b"\x1e"  # the marker's delimiter: a byte no ordinary output contains
_QUOTED = [chr(b) if 0x20 <= b < 0x7F and b not in (0x27, 0x5C) else f"\\x{b:02x}" for b in range(256)]
_QUOTED[0x0A], _QUOTED[0x27], _QUOTED[0x5C] = "\\n", "\\'", "\\\\"


# Before each command: take the notices of background jobs that ended since the
# last one (bash would print them in this command's output), silently.
_NOTICES = "jobs >/dev/null"  # its stderr: the shell's own, /dev/null


def quote_command(command: str, seq: int) -> bytes:
    """The input line(s) that run ``command`` as command number ``seq``. Its stderr
    is the terminal (``2>&1``): the shell's own is /dev/null (see ``init_line``)."""
    data = command.encode("utf-8", "surrogateescape")
    quoted = "".join(_QUOTED[b] for b in data)
    if len(quoted) + 80 <= LINE_LIMIT:
        return f"__rs_seq={seq}; {_NOTICES}; eval $'{quoted}' 2>&1\n".encode()
    # Chunk the raw bytes (a chunk quotes to at most 4x its size) so no escape is
    # split; the group runs only when its closing line arrives.
    step = (LINE_LIMIT - 40) // 4
    parts = ["".join(_QUOTED[b] for b in data[i : i + step]) for i in range(0, len(data), step)]
    lines = [f"{{ __rs_seq={seq}; __rs_cmd=''"] + [f"__rs_cmd+=$'{p}'" for p in parts]
    lines.append(f'{_NOTICES}; eval "$__rs_cmd" 2>&1; }}')
    return ("\n".join(lines) + "\n").encode()


def init_line(nonce: str, seq: int, cwd_command: str = "") -> bytes:
    """What turns a fresh interactive bash into one we can drive.

    The marker comes from PROMPT_COMMAND, run afresh before every prompt; PS1 is
    expanded too early on some error paths (after an eval syntax error it shows the
    old seq). Set here, not through env: a nested shell must not print our marker.
    PROMPT_COMMAND is read-only: an rc file or tool that rewrote it would hang every
    later call until its timeout.

    It prints the shell's pid (``rs-pid:N``, see ``shell_pid``), then points the
    shell's own stderr at /dev/null: what bash prints there between commands is job
    notices (``[1]+ Terminated ...``) that would land in the next command's output.
    """
    return (
        f"stty -echo -onlcr 2>/dev/null; __rs_seq={seq}; PS1=''; PS2=''; PS0=''; "
        f'PROMPT_COMMAND=\'printf "\\036{nonce}:%s:%s\\036" "$__rs_seq" "$?"\'; '
        "readonly PROMPT_COMMAND; unset HISTFILE MAILCHECK; set +H +o history; "
        f"{cwd_command}printf 'rs-pid:%s\\n' \"$$\"; exec 2>/dev/null\n"
    ).encode()


def shell_pid(init_output: str) -> int | None:
    """The shell's ``$$`` from what ``init_line`` printed."""
    found = re.search(r"rs-pid:(\d+)", init_output)
    return int(found.group(1)) if found else None


class MarkerScanner:
    """Splits the terminal's byte stream into command output and prompt markers.

    Bytes are held back only from a trailing RS on (a marker may be cut in two by
    the read that delivered it), so output reaches ``expect`` checks at once.
    """

    def __init__(self, nonce: str):
        self.marker = re.compile(RS + nonce.encode() + rb":(\d*):(\d+)" + RS)
        self.pending = bytearray()  # read, not yet attributed

    def scan(self, seq: int, sink: HeadTail, recent: bytearray) -> int | None:
        """Move output into ``sink``; the exit code if command ``seq``'s marker came.
        Markers of earlier commands (a late C-c's prompt) are dropped."""
        pending = self.pending
        while (match := self.marker.search(pending)) is not None:
            found, code, start, end = match.group(1), int(match.group(2)), match.start(), match.end()
            if found == str(seq).encode():
                self.commit(sink, recent, start)
                del pending[: end - start]
                return code
            del pending[start:end]
        cut = pending.rfind(RS, max(0, len(pending) - 48))
        self.commit(sink, recent, cut if cut >= 0 else len(pending))
        return None

    def has_marker(self, seq: int) -> bool:
        """Whether command ``seq``'s marker is among the bytes read so far."""
        return any(m.group(1) == str(seq).encode() for m in self.marker.finditer(self.pending))

    def commit(self, sink: HeadTail, recent: bytearray, upto: int | None = None) -> None:
        """Move the first ``upto`` pending bytes (all by default) into the output."""
        upto = len(self.pending) if upto is None else upto
        if upto <= 0:
            return
        data = bytes(self.pending[:upto])
        del self.pending[:upto]
        sink.append(data)
        recent += data
        if len(recent) > 8192:
            del recent[:-8192]


_ANNOUNCED = re.compile(r"\[(\d+)\] \d+")  # `[2] 4711`: a job this command started
# `[2]-  Terminated   sleep 6  (wd: /tmp)`: bash's line for a job that ended (not a
# `jobs` listing of one that runs or is stopped), maybe with `(wd now: ...)` after.
_ENDED = re.compile(r"\[(\d+)\][+\- ] +(?!Running\b|Stopped\b)\S.*")
_WD_NOW = re.compile(r"\(wd now: .*\)")


class JobNotices:
    """Keeps bash's notices of jobs that EARLIER commands started out of a command's
    output. Bash prints them where it notices the end: at the next prompt, or in
    whichever later command's foreground wait comes first, so the shell's own
    stderr and a silent ``jobs`` before each command (see ``quote_command``) cannot
    catch a job that ends while a later command runs. Only lines in bash's exact
    format for a job number that an earlier command announced (``[N] PID``), and
    this one has not, are dropped; sessions without background jobs drop nothing."""

    def __init__(self) -> None:
        self.earlier: set[int] = set()  # job numbers earlier commands announced

    def reset(self) -> None:
        """A new shell: its job numbers start again."""
        self.earlier.clear()

    def clean(self, output: str) -> str:
        """``output`` without the notices of earlier commands' jobs; learns the jobs
        this command announced."""
        if "[" not in output:
            return output
        kept: list[str] = []
        own: set[int] = set()
        after_dropped = False
        for line in output.splitlines(keepends=True):
            bare = line.rstrip("\n")
            if after_dropped and _WD_NOW.fullmatch(bare):
                after_dropped = False
                continue
            after_dropped = False
            if (found := _ANNOUNCED.fullmatch(bare)) is not None:
                own.add(int(found.group(1)))
            elif (found := _ENDED.fullmatch(bare)) is not None:
                number = int(found.group(1))
                if number in self.earlier and number not in own:
                    after_dropped = True
                    continue
            kept.append(line)
        self.earlier |= own
        return "".join(kept)


def signal_foreground(process: SandboxProcess, signum: int) -> bool:
    """Signal the foreground process group of ``process``'s terminal, unless it is the
    shell's own (see ``SandboxProcess.signal_foreground``); False where the runtime
    cannot tell (pipes, a terminal bridged by a container engine)."""
    return bool(process.signal_foreground(signum))
