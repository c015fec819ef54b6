#!/bin/bash
# Verifier: each key of /app/report.json against the report kept here
# (expected_report.json, computed from the pristine log). Writes reward.json, last:
# one component per key (1.0 or 0.0), and "reward", 1.0 only when every key is right.
TESTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p /logs/verifier
rm -f /logs/verifier/reward.txt /logs/verifier/reward.json
components="$(python3 -I "$TESTS_DIR/check.py" "$TESTS_DIR")" || components='{}'
python3 -I -c '
import json, sys
try:
    components = json.loads(sys.argv[1])
except ValueError:
    components = {}
expected = json.load(open(sys.argv[2]))
components = {key: float(components.get(key, 0.0)) for key in expected}
components["reward"] = 1.0 if all(value == 1.0 for value in components.values()) else 0.0
with open("/logs/verifier/reward.json", "w") as out:
    json.dump(components, out, sort_keys=True)
' "$components" "$TESTS_DIR/expected_report.json" || echo '{"reward": 0.0}' > /logs/verifier/reward.json
