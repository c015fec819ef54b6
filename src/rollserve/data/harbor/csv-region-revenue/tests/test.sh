#!/bin/bash
# Verifier: /app/summary.csv must equal the summary kept here (expected_summary.csv,
# computed from the pristine sales.csv), byte for byte. The reward is written last.
TESTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p /logs/verifier
rm -f /logs/verifier/reward.txt /logs/verifier/reward.json
reward=0
if [ -f summary.csv ] && [ ! -L summary.csv ] && cmp -s summary.csv "$TESTS_DIR/expected_summary.csv"; then
    reward=1
else
    echo "summary.csv differs from the expected summary:"
    diff "$TESTS_DIR/expected_summary.csv" summary.csv | head -20
fi
echo "$reward" > /logs/verifier/reward.txt
