#!/bin/bash
# Reference solution: find's modification times, sorted oldest first; all but the
# KEEP newest deleted.
set -euo pipefail
cat > prune.sh <<'SCRIPT'
#!/bin/bash
usage() { echo "usage: prune.sh DIR KEEP" >&2; exit 2; }
[ "$#" -eq 2 ] || usage
dir="$1" keep="$2"
[[ "$keep" =~ ^[0-9]+$ ]] || usage
[ -d "$dir" ] || usage
mapfile -t logs < <(find "$dir" -mindepth 1 -maxdepth 1 -type f -name '*.log' -printf '%T@\t%f\n' \
                    | sort -n | cut -f2-)
count="${#logs[@]}"
keep=$((10#$keep))
for ((i = 0; i < count - keep; i++)); do
    rm -f -- "$dir/${logs[$i]}"
    printf '%s\n' "${logs[$i]}"
done
exit 0
SCRIPT
chmod +x prune.sh
