#!/bin/bash
# Reference solution: one jq program (group the active users by their normalised team).
set -euo pipefail
jq '
  [.users[] | select(.active and (.team != null)) | .team |= (ascii_downcase | ltrimstr(" ") | rtrimstr(" "))]
  | group_by(.team)
  | map({key: .[0].team, value: {
      members: (map(.username) | sort),
      count: length,
      average_age: ((map(.age) | add) / length * 10 | round / 10),
      skills: (map(.skills[]) | unique)}})
  | from_entries
' users.json > by_team.json
