"""What the command-line options default to, read from the models the options fill.

An option that sets a model's field (``--init-workers`` sets ``EngineConfig.init_workers``)
takes its default from that model, never from a literal of its own, so changing a
model's default changes the command line's with it (``tests/test_cli_defaults.py`` holds
every such option to its field). These are instances made with no arguments: each field
is the model's default, typed as the model types it.
"""

from __future__ import annotations

from rollserve.api.prorl import ProRLConfig
from rollserve.client.run_dataset import RunOptions
from rollserve.commands.quickstart import QuickstartOptions
from rollserve.engine.pipeline import EngineConfig
from rollserve.engine.requests import MIB, RequestLimits
from rollserve.llm.routing import RouterConfig
from rollserve.server import ServerConfig

SERVER = ServerConfig()  # (its state_dir reads $ROLLSERVE_STATE_DIR, as `serve` always did)
ENGINE = EngineConfig()
ROUTER = RouterConfig()
LIMITS = RequestLimits()
PRORL = ProRLConfig()
RUN = RunOptions()
QUICKSTART = QuickstartOptions()

HOUR = 3600.0
# The units the options use where the model's differ.
RETENTION_HOURS = ENGINE.retention_s / HOUR
MAX_REQUEST_MB = LIMITS.max_request_bytes / MIB
MAX_INSTANCE_MB = LIMITS.max_instance_bytes / MIB
