"""Trainer-side clients for the rollserve API (sync and async)."""

from rollserve.client.aio import AsyncClient
from rollserve.client.calls import RollserveError
from rollserve.client.sync import Client

__all__ = ["AsyncClient", "Client", "RollserveError"]
