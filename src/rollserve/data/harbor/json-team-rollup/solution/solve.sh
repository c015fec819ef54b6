#!/bin/bash
# Reference solution: group the active users by their normalised team, in Python.
set -euo pipefail
python3 - <<'PY'
import json

with open("users.json") as f:
    users = json.load(f)["users"]
teams = {}
for user in users:
    if not user["active"] or user.get("team") is None:
        continue
    teams.setdefault(user["team"].strip().lower(), []).append(user)
rollup = {}
for team, members in sorted(teams.items()):
    rollup[team] = {"members": sorted(m["username"] for m in members), "count": len(members),
                    "average_age": round(sum(m["age"] for m in members) / len(members), 1),
                    "skills": sorted({skill for m in members for skill in m["skills"]})}
with open("by_team.json", "w") as out:
    json.dump(rollup, out, indent=2)
PY
