"""A real ``rollserve serve`` process with long-polls and event streams open gets SIGTERM:
each is answered or ended cleanly at once (a long-poll: 200 with what there is; a stream:
its last chunk), and the server exits without waiting out uvicorn's graceful timeout,
so no request is cancelled mid-response and no ASGI traceback reaches its log."""

from __future__ import annotations

import json
import signal
import socket
import subprocess

import httpx

EXIT_BOUND = 60.0  # seconds: only so a hung server fails the test instead of hanging it
READ_BOUND = 60.0


def _open(port: int, path: str) -> socket.socket:
    """``GET path`` sent on a connection of its own (the bytes are in the server's
    socket when this returns)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=READ_BOUND)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: rollserve\r\nConnection: close\r\n\r\n".encode())
    return sock


def _read_headers(sock: socket.socket) -> bytes:
    """Read until the response's headers are in (a stream that sent them is open)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed before the headers: {data!r}"
        data += chunk
    return data


def _read_to_end(sock: socket.socket, data: bytes = b"") -> bytes:
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


def test_sigterm_ends_long_polls_and_streams_at_once(server_factory):
    server = server_factory().start()  # no backend: a rollout stays queued
    r = httpx.post(
        f"{server.url}/v1/rollouts",
        json={"tasks": [{"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}}]},
        timeout=30,
    )
    assert r.status_code == 202, r.text
    (rollout_id,) = r.json()["groups"][0]["rollout_ids"]
    group_id = r.json()["groups"][0]["group_id"]
    events = _open(server.port, "/v1/events")
    status = _open(server.port, "/v1/status/stream?interval=60")
    polls = {
        name: _open(server.port, path)
        for name, path in (
            ("results", "/v1/results?wait=600"),
            ("rollout", f"/v1/rollouts/{rollout_id}?wait=600"),
            ("group", f"/v1/groups/{group_id}?wait=600&results=false"),
        )
    }
    streams = {"events": (events, _read_headers(events)), "status": (status, _read_headers(status))}
    # The long-polls were sent before this call: answered after them on one event loop,
    # it finds their handlers waiting.
    assert httpx.get(f"{server.url}/healthz", timeout=30).status_code == 200
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)

    answers = {name: _read_to_end(sock) for name, sock in polls.items()}
    for name, raw in answers.items():
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), (name, raw[:400])
        if name == "results":
            assert json.loads(body) == {"results": [], "next": 0}
        if name == "rollout":
            assert json.loads(body)["done"] is False
    for name, (sock, head) in streams.items():
        raw = _read_to_end(sock, head)
        assert raw.startswith(b"HTTP/1.1 200"), (name, raw[:400])
        assert raw.endswith(b"0\r\n\r\n"), f"the {name} stream was cut, not ended: {raw[-200:]!r}"
    try:
        server.proc.wait(timeout=EXIT_BOUND)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running {EXIT_BOUND:g} s after SIGTERM") from None
    log = server.log.read_text()
    assert "timeout graceful shutdown exceeded" not in log, log[-3000:]
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]
