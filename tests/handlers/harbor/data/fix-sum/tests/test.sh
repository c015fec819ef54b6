#!/bin/bash
# Runs the agent's program on cases kept here; writes named components.
cd /tests
python3 check.py > /logs/verifier/check.txt 2>&1
passed=$(grep -c '^ok' /logs/verifier/check.txt)
total=$(grep -c '^case' /tests/cases.txt)
if [ "$passed" = "$total" ]; then reward=1; else reward=0; fi
printf '{"reward": %s, "cases_passed": %s}\n' "$reward" "$passed" > /logs/verifier/reward.json
