#!/bin/bash
# Reference solution: import the stream, bisect with check.sh, revert the culprit on a branch.
set -euo pipefail
git init -q -b main repo
cd repo
git fast-import --quiet < ../history.fi
git checkout -q main
first="$(git rev-list --max-parents=0 main)"
git bisect start main "$first" > /dev/null
git bisect run ./check.sh > /tmp/bisect.log 2>&1
culprit="$(git rev-parse refs/bisect/bad)"
git bisect reset > /dev/null 2>&1
echo "$culprit" > ../culprit.txt
git checkout -q -b fix main
git -c user.name="Oracle" -c user.email="oracle@rollserve.invalid" revert --no-edit "$culprit" > /dev/null
./check.sh > /dev/null
