"""The forwarder that runs INSIDE a sandbox (the standard library only; its source is
handed to the sandbox's python with ``-c``).

    python -c <this source> <unix socket> -- <command...>

It listens on 127.0.0.1 at a free port of the sandbox's own network namespace (the
sandbox has no other network), forwards each connection byte for byte to the
gateway's unix socket (in the server's read-only folder /.rollserve), and runs
the harness command with ``OPENAI_BASE_URL`` (and ``ANTHROPIC_BASE_URL``, without the
``/v1`` Anthropic's clients add themselves) pointing at itself. It exits with the
command's exit status. Nothing but the one socket is reachable through it.
"""

from __future__ import annotations

import asyncio
import os
import sys

CHUNK = 65536


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def _forward(socket_path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        upstream_reader, upstream_writer = await asyncio.open_unix_connection(socket_path)
    except OSError:
        writer.close()
        return
    try:
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
    finally:
        for side in (writer, upstream_writer):
            side.close()


async def main(socket_path: str, command: list[str]) -> int:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _forward(socket_path, reader, writer)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    base = f"http://127.0.0.1:{port}/v1"
    env = dict(os.environ, OPENAI_BASE_URL=base, OPENAI_API_BASE=base)
    env["ANTHROPIC_BASE_URL"] = f"http://127.0.0.1:{port}"
    process = await asyncio.create_subprocess_exec(*command, env=env)
    return await process.wait()


if __name__ == "__main__":
    # python -c SOURCE <socket> -- <command...>: argv is ["-c", socket, "--", command...]
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit("usage: forwarder <unix socket> -- <command...>")
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[3:])))
