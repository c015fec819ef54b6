"""Compares /app/report.json (the working directory's) with the report kept beside this
file; prints one JSON object: each key's component (1.0 right, 0.0 wrong or missing)."""

import json
import math
import os
import sys

expected = json.load(open(os.path.join(sys.argv[1], "expected_report.json")))
components = {key: 0.0 for key in expected}
try:
    if os.path.islink("report.json"):
        raise ValueError("report.json is a link")
    with open("report.json") as f:
        report = json.load(f)
    if not isinstance(report, dict) or set(report) != set(expected):
        print(f"report keys: {sorted(report) if isinstance(report, dict) else type(report).__name__}",
              file=sys.stderr)
    else:
        for key, want in expected.items():
            got = report[key]
            if key == "error_rate":
                ok = isinstance(got, (int, float)) and not isinstance(got, bool) and math.isclose(
                    got, want, abs_tol=5e-5)
            else:
                ok = got == want and type(got) is type(want)
            components[key] = 1.0 if ok else 0.0
            if not ok:
                print(f"{key}: expected {want!r}, got {got!r}", file=sys.stderr)
except (OSError, ValueError) as error:
    print(f"no readable report.json: {error}", file=sys.stderr)
print(json.dumps(components))
