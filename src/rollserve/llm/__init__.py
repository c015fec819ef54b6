"""Inference backends, the router and token bookkeeping."""
