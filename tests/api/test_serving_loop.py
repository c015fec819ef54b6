"""``serve`` runs uvicorn on the API-first loop with the slice asked for, in
milliseconds (``--rollout-slice-ms``), and on uvicorn's own loop without one."""

from __future__ import annotations

import pytest

from rollserve.api.serving import Server, serve
from rollserve.engine.priority import ApiFirstLoop


@pytest.mark.parametrize(("slice_ms", "slice_s"), [(5, 0.005), (0.5, 0.0005), (None, None)])
def test_serve_runs_on_the_api_first_loop_with_the_slice_asked(monkeypatch, slice_ms, slice_s):
    servers: list[Server] = []

    def run(self: Server, sockets: object = None) -> None:
        servers.append(self)
        self.started = True

    monkeypatch.setattr(Server, "run", run)
    serve(object(), object(), rollout_slice_ms=slice_ms)  # type: ignore[arg-type]
    factory = servers[0].config.get_loop_factory()
    loop = factory() if factory is not None else None
    try:
        if slice_s is None:
            assert not isinstance(loop, ApiFirstLoop)
        else:
            assert isinstance(loop, ApiFirstLoop) and loop.slice_s == pytest.approx(slice_s)
    finally:
        if loop is not None:
            loop.close()
