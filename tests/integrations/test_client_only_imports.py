"""rollserve.integrations works in a trainer's client-only environment: importing it
loads nothing of the server and none of the trainer libraries (they are made
unimportable here, as in a venv without them)."""

import subprocess
import sys

SERVER = (
    "rollserve.api",
    "rollserve.engine",
    "rollserve.handlers",
    "rollserve.agent",
    "rollserve.llm",
    "rollserve.sandbox",
    "rollserve.server",
    "rollserve.errors",
    "rollserve.testing",
    "rollserve.datasets",
)
BLOCKED = ("trl", "verl", "omegaconf", "torch", "transformers", "datasets", "accelerate", "peft")

SCRIPT = f"""
import sys
for name in {BLOCKED!r}:
    sys.modules[name] = None  # import raises ImportError, as when it is not installed
import rollserve.integrations
import rollserve.integrations.groups
import rollserve.integrations.tensors
import rollserve.integrations.trl
import rollserve.integrations.verl_rows
try:
    import rollserve.integrations.verl
except ImportError as exc:
    assert "pip install 'rollserve[verl]'" in str(exc), exc
else:
    raise AssertionError("rollserve.integrations.verl imported without verl")
from rollserve.integrations.trl import task_prompt
task_prompt({{"data_source": "math", "instance": {{"question": "1 + 1?", "answer": "2"}}}})
loaded = sorted(m for m in sys.modules if m.startswith({SERVER!r}))
print(loaded)
"""


def test_integrations_import_only_client_and_contract():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
