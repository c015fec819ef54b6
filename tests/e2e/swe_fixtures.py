"""What the swe API tests share: a service factory whose swe handler's mirrors hold
the toy repository."""

from __future__ import annotations

from pathlib import Path


def swe_service(make_api, llm_url: str, tmp_path: Path, mirrors: str, **defaults):
    """``make(**options)``: a service (make_api's) whose swe handler has ``defaults``
    overridden by ``options``, its mirrors in ``tmp_path / mirrors`` and its repository
    cache in ``tmp_path / "cache"``."""

    async def make(**options):
        return await make_api([llm_url], server={"handler_options": {"swe": {
            "mirrors": [str(tmp_path / mirrors)], "repo_cache": str(tmp_path / "cache"),
            **defaults, **options}}})

    return make
