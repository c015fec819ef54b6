"""Compares the working directory's by_team.json with the roll-up kept beside this file
(expected_by_team.json, made from the pristine export). Exit 0: equal (the average ages
within rounding of one decimal)."""

import json
import os
import sys

with open(os.path.join(sys.argv[1], "expected_by_team.json")) as f:
    expected = json.load(f)
try:
    if os.path.islink("by_team.json"):
        raise ValueError("by_team.json is a link")
    with open("by_team.json") as f:
        got = json.load(f)
except (OSError, ValueError) as error:
    print(f"FAIL: no readable by_team.json: {error}")
    sys.exit(1)
failures = []
if not isinstance(got, dict) or set(got) != set(expected):
    failures.append(f"teams: {sorted(got) if isinstance(got, dict) else type(got).__name__}, "
                    f"expected {sorted(expected)}")
else:
    for team, want in expected.items():
        have = got[team]
        if not isinstance(have, dict) or set(have) != set(want):
            failures.append(f"{team}: keys {sorted(have) if isinstance(have, dict) else have!r}")
            continue
        for key in ("members", "count", "skills"):
            if have[key] != want[key] or type(have[key]) is not type(want[key]):
                failures.append(f"{team}.{key}: {have[key]!r}, expected {want[key]!r}")
        age = have["average_age"]
        if isinstance(age, bool) or not isinstance(age, (int, float)) or abs(age - want["average_age"]) > 0.051:
            failures.append(f"{team}.average_age: {age!r}, expected {want['average_age']!r}")
for failure in failures:
    print(f"FAIL: {failure}")
sys.exit(1 if failures else 0)
