#!/bin/bash
# Reference solution: the fixed module beside this script (a fresh list of tags per
# item, remove() refusing more than there is, two decimals, 1-based pages).
set -euo pipefail
SOLUTION_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cp "$SOLUTION_DIR/core.py" inventory/core.py
python3 -m unittest -q test_inventory
