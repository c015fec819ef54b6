"""Rollouts across a Ray cluster (``rollserve serve --ray auto|ADDRESS``; the
``rollserve[ray]`` extra).

The head process keeps everything it has on one machine (API, store, results cursor,
pools, deadlines, one asyncio task per rollout); what moves is where a stage's
handler work runs (``engine.executor``): ``RayExecutor`` places each rollout on a node
and calls that node's ``NodeWorker`` actor, which owns the node's sandboxes (owner
records in a node-local state dir), its own router replica (LLM traffic goes from the
node to the backends) and the rollouts it hosts between their stages.

Like ``server.py`` this package composes the layers; ray is imported only by the
head's modules (``executor``, ``watch``, ``calls``, ``link``: the batches of stage
calls and cleanups each node gets), and only a server started with ``--ray`` imports
them.
"""
