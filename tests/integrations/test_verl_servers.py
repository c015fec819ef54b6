"""``verl_rows.verl_servers``: verl's inference servers, read from the load balancer
verl's ``LLMServerClient`` keeps on a private attribute (no public API lists them to
an agent loop), guarded: a verl without it is a clear error naming its version. The
real verl path runs in tests/integrations/test_verl_loop.py (``backends: verl``)."""

from __future__ import annotations

import pytest

from rollserve.integrations.verl_rows import verl_servers


class _Remote:
    """A Ray actor method's handle: ``.remote()`` gives something to await."""

    def __init__(self, result: list[str]) -> None:
        self.result = result

    async def remote(self) -> list[str]:
        return self.result


class _Balancer:
    def __init__(self, servers: list[str]) -> None:
        self.get_all_servers = _Remote(servers)


class LLMServerClient:
    def __init__(self, balancer: object) -> None:
        self._load_balancer = balancer


async def test_the_servers_verls_load_balancer_lists():
    client = LLMServerClient(_Balancer(["10.0.0.1:8000", "10.0.0.2:8000"]))
    assert await verl_servers(client, "0.9.1") == ["10.0.0.1:8000", "10.0.0.2:8000"]


@pytest.mark.parametrize(
    "client",
    [
        LLMServerClient(None),  # a client built without a balancer
        LLMServerClient(object()),  # a balancer that lists nothing
        object(),  # a verl that keeps it elsewhere
    ],
    ids=["no-balancer", "no-listing", "no-attribute"],
)
async def test_a_verl_without_the_balancer_is_a_clear_error(client):
    with pytest.raises(ValueError, match=r"verl 0\.10\.0's .* no load balancer.*backends: registered"):
        await verl_servers(client, "0.10.0")
