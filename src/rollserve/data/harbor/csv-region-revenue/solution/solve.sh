#!/bin/bash
# Reference solution: parse the CSV properly (quoted fields hold commas), aggregate in Python.
set -euo pipefail
python3 - <<'PY'
import csv
from decimal import Decimal

totals = {}
with open("sales.csv", newline="") as f:
    for row in csv.DictReader(f):
        if row["status"] != "completed":
            continue
        orders, units, revenue = totals.get(row["region"], (0, 0, Decimal(0)))
        n = int(row["units"])
        totals[row["region"]] = (orders + 1, units + n, revenue + n * Decimal(row["unit_price"]))
with open("summary.csv", "w") as out:
    out.write("region,orders,units,revenue\n")
    for region, (orders, units, revenue) in sorted(totals.items(), key=lambda kv: (-kv[1][2], kv[0])):
        out.write(f"{region},{orders},{units},{revenue:.2f}\n")
PY
