"""Output cleaning, head+tail truncation, key names and command quoting."""

from __future__ import annotations

import subprocess

import pytest

from rollserve.sandbox.tools.keys import is_key_sequence, key_bytes
from rollserve.sandbox.tools.shell_wire import LINE_LIMIT, JobNotices, quote_command
from rollserve.sandbox.tools.text import HeadTail, clean_terminal_text, truncate_middle


@pytest.mark.parametrize(
    "raw, clean",
    [
        ("\x1b[1;32mgreen\x1b[0m", "green"),
        ("\x1b]0;window title\x07text", "text"),
        ("\x1b[?2004hprompt\x1b[?2004l", "prompt"),
        ("10%\r50%\r100%\n", "100%\n"),
        ("line\r\nnext\r\n", "line\nnext\n"),
        ("b\x08bo\x08ol\x08ld", "bold"),
        ("bell\x07 nul\x00 ok\ttab", "bell nul ok\ttab"),
    ],
)
def test_clean_terminal_text(raw, clean):
    assert clean_terminal_text(raw) == clean


def test_head_tail_keeps_both_ends_in_bounded_memory():
    buf = HeadTail(head=10, tail=10)
    for i in range(10_000):
        buf.append(f"{i:05d}\n".encode())
    assert buf.total == 60_000 and buf.dropped == 59_980
    assert len(buf.head) == 10 and len(buf.tail) == 10
    text = buf.text()
    assert text.startswith("00000\n0000") and text.endswith("998\n09999\n")
    assert "59980 bytes of output dropped" in text


def test_head_tail_does_not_split_a_character_when_nothing_is_dropped():
    buf = HeadTail(head=3, tail=10)
    buf.append("ab✓cd".encode())  # the check mark straddles the head/tail boundary
    assert buf.text() == "ab✓cd"


def test_truncate_middle():
    assert truncate_middle("short", 100) == ("short", 0)
    text, dropped = truncate_middle("a" * 50 + "b" * 50, 20)
    assert dropped == 80 and text.startswith("a" * 10) and text.endswith("b" * 10)


@pytest.mark.parametrize(
    "name, data",
    [
        ("C-c", b"\x03"),
        ("c-d", b"\x04"),
        ("^C", b"\x03"),
        ("C-\\", b"\x1c"),
        ("C-[", b"\x1b"),
        ("Enter", b"\r"),
        ("Tab", b"\t"),
        ("Escape", b"\x1b"),
        ("Up", b"\x1b[A"),
        ("M-x", b"\x1bx"),
        ("BSpace", b"\x7f"),
    ],
)
def test_key_bytes(name, data):
    assert key_bytes(name) == data


def test_unknown_keys_and_key_sequences():
    with pytest.raises(ValueError, match="unknown key"):
        key_bytes("Hyper-x")
    assert is_key_sequence("C-c") and is_key_sequence("Up Up Enter")
    assert not is_key_sequence("ls -la") and not is_key_sequence("")


@pytest.mark.parametrize(
    "command",
    [
        "echo plain",
        "printf '%s' \"it's\" \\\\ $'\\t'",
        "echo ünï ✓",
        "a\nb\n\tc",
        "".join(chr(c) for c in range(1, 128)),
        "x" * (3 * LINE_LIMIT),
    ],
)
def test_quote_command_round_trips_through_bash(command):
    """What bash evaluates is exactly the command, whatever bytes it holds."""
    line = quote_command(command, seq=7)
    assert all(len(part) < 4095 for part in line.split(b"\n"))
    probe = (
        line.replace(b"eval ", b"printf '%s' ", 1)
        if line.startswith(b"__rs_seq")
        else line.replace(b'eval "$__rs_cmd"', b"printf '%s' \"$__rs_cmd\"")
    )
    out = subprocess.run(["bash", "--norc", "-c", probe.decode()], capture_output=True, check=True)
    assert out.stdout == command.encode()


def test_job_notices_of_earlier_commands_are_dropped_and_no_other_line():
    notices = JobNotices()
    # No background job yet: lines in bash's format are output like any other.
    assert notices.clean("[1]+  Done   made up\n") == "[1]+  Done   made up\n"
    assert notices.clean("[1] 4711\n[2] 4712\n") == "[1] 4711\n[2] 4712\n"  # jobs 1 and 2 started
    output = (
        "[2]-  Terminated              sleep 6\n"
        "[1]+  Done                    sleep 0.3  (wd: /tmp)\n(wd now: /tmp/x)\n"
        "[1]+  Running                 sleep 5 &\n"  # a `jobs` listing stays
        "[3] 4713\n[3]+  Exit 3                  false\n"  # this command's own job
        "real output [1]+  Done\n"
    )
    assert notices.clean(output) == (
        "[1]+  Running                 sleep 5 &\n"
        "[3] 4713\n[3]+  Exit 3                  false\n"
        "real output [1]+  Done\n"
    )
    assert notices.earlier == {1, 2, 3}
    notices.reset()  # a new shell
    assert notices.clean("[1]+  Done   sleep 1\n") == "[1]+  Done   sleep 1\n"
