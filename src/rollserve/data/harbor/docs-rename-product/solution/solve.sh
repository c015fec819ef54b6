#!/bin/bash
# Reference solution: awk tracks whether a line is inside a ```text block, and
# substitutes only outside one; CHANGELOG.md is left out.
set -euo pipefail
find docs -type f -name '*.md' ! -path docs/CHANGELOG.md -print0 | while IFS= read -r -d '' file; do
    awk '
        frozen && /^```/ { frozen = 0; print; next }
        !frozen && !code && /^```text$/ { frozen = 1; print; next }
        !frozen && /^```/ { code = !code }
        frozen { print; next }
        { gsub(/Acme Widget/, "Rollout Widget"); gsub(/acme-widget/, "rollout"); print }
    ' "$file" > "$file.new"
    mv -- "$file.new" "$file"
done
