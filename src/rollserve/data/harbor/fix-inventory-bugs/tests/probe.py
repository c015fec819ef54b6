"""Run by check.py (as ``python3 -I -c``) in a process of its own, on the agent's
library (the folder given, put LAST on sys.path so that it cannot shadow the standard
library): reads scenarios (JSON) from stdin, prints each operation's outcome (JSON).
It decides nothing: check.py compares."""

import json
import sys

sys.path.append(sys.argv[1])
from inventory import Inventory  # noqa: E402

outcomes = []
for scenario in json.load(sys.stdin):
    stock = Inventory()
    results = []
    for method, *args in scenario:
        try:
            results.append({"ok": getattr(stock, method)(*args)})
        except Exception as error:  # noqa: BLE001 (the outcome is the exception's type)
            results.append({"error": type(error).__name__})
    outcomes.append(results)
print(json.dumps(outcomes))
