#!/bin/bash
# Verifier: docs/ against the renamed texts kept here (expected.json, check.py).
# The reward (1 or 0) is written last.
TESTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p /logs/verifier
rm -f /logs/verifier/reward.txt /logs/verifier/reward.json
reward=0
if python3 -I "$TESTS_DIR/check.py" "$TESTS_DIR"; then
    reward=1
fi
echo "$reward" > /logs/verifier/reward.txt
