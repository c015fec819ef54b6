#!/bin/bash
# Reference solution: version sort, delete all but the last two, modes, then the links.
set -euo pipefail
mapfile -t versions < <(ls releases | sort -V)
count="${#versions[@]}"
for ((i = 0; i < count - 2; i++)); do
    rm -rf -- "releases/${versions[$i]}"
done
newest="${versions[$((count - 1))]}"
find releases -mindepth 1 -type d -exec chmod 755 {} +
find releases -type f -exec chmod 644 {} +
find releases -type f -path '*/bin/*' -exec chmod 755 {} +
ln -sfn "releases/$newest" current
ln -f "releases/$newest/config.ini" config.ini
