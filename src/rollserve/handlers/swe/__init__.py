"""The SWE task family (SWE-bench, SWE-Gym, R2E-Gym, the bundled swe-mini suite)."""

from rollserve.handlers.swe.handler import SWEHandler

__all__ = ["SWEHandler"]
