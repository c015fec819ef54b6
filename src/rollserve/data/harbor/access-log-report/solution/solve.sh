#!/bin/bash
# Reference solution: a regular expression per line, counters, one JSON object.
set -euo pipefail
python3 - <<'PY'
import collections, json, re

LINE = re.compile(r'^(\S+) \S+ \S+ \[[^\]]+\] "(\S+) (\S+) [^"]*" (\d{3}) (\d+|-) "[^"]*" "[^"]*"$')
clients, statuses, paths, sizes = set(), collections.Counter(), collections.Counter(), 0
requests = errors = 0
with open("access.log") as log:
    for line in log:
        match = LINE.match(line.rstrip("\n"))
        if not match:
            continue
        client, _method, target, status, size = match.groups()
        requests += 1
        clients.add(client)
        statuses[status] += 1
        paths[target.split("?", 1)[0]] += 1
        sizes += 0 if size == "-" else int(size)
        errors += int(status) >= 500
top = sorted(paths.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
report = {"requests": requests, "unique_clients": len(clients), "status": dict(statuses),
          "top_paths": [[path, count] for path, count in top], "bytes": sizes,
          "error_rate": round(errors / requests, 4)}
with open("report.json", "w") as out:
    json.dump(report, out, indent=2)
PY
