#!/bin/bash
# Reference solution: walk the inbox in byte order, keep the first file of each
# content (by its sha256), move it under its category, then remove the inbox.
set -euo pipefail
export LC_ALL=C
declare -A seen
while IFS= read -r -d '' path; do
    sum="$(sha256sum < "$path" | cut -d' ' -f1)"
    if [ -n "${seen[$sum]:-}" ]; then
        rm -- "$path"
        continue
    fi
    seen[$sum]=1
    name="$(basename -- "$path" | tr '[:upper:]' '[:lower:]')"
    case "$name" in
        *.png|*.jpg|*.jpeg|*.gif) category=images ;;
        *.pdf|*.md|*.txt) category=documents ;;
        *.csv|*.json) category=data ;;
        *) category=other ;;
    esac
    mkdir -p "sorted/$category"
    mv -- "$path" "sorted/$category/$name"
done < <(cd . && find inbox -type f -print0 | sort -z)
rm -r inbox
