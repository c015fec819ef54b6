#!/bin/bash
# The expected answer lives here, in tests/: editing the input changes nothing.
mkdir -p /logs/verifier
got=$(tr -d '[:space:]' < /app/count.txt 2>/dev/null)
want=$(tr -d '[:space:]' < "$EXPECTED_FILE")
if [ "$got" = "$want" ] && [ "$(pwd)" = /app ] && [ -z "$TASK_SECRET_FROM_AGENT" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "got '$got' want '$want' in $(pwd)"
  echo 0 > /logs/verifier/reward.txt
fi
