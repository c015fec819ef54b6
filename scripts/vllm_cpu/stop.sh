#!/usr/bin/env bash
# Stop the vLLM server that start.sh started (pid in $ROLLSERVE_VLLM_HOME/server.pid).
#
# SIGTERM first: vLLM then shuts its engine process down itself (~3 s). If the server
# is still there after ROLLSERVE_VLLM_STOP_TIMEOUT seconds (default 30), or leaves
# processes behind, SIGKILL its process group: start.sh gave it one of its own (setsid),
# so that group holds the server's processes and nothing else.
# Safe to run when nothing is running; exits 0 once no server process remains.
set -euo pipefail

VLLM_HOME=${ROLLSERVE_VLLM_HOME:-$HOME/.cache/rollserve/vllm-cpu}
PID_FILE=$VLLM_HOME/server.pid
STOP_TIMEOUT=${ROLLSERVE_VLLM_STOP_TIMEOUT:-30}

say() { echo "[vllm-cpu] $*" >&2; }

pid=$(cat "$PID_FILE" 2>/dev/null || true)
if [ -z "$pid" ]; then
  say "no server to stop (no $PID_FILE)"
  exit 0
fi

group_alive() { kill -0 -- "-$pid" 2>/dev/null; }  # any process left in its group?

# The pid file may be stale and the pid reused since: only signal a process that is
# the vLLM server we started (its command line names our serve.py).
if kill -0 "$pid" 2>/dev/null; then
  if ! tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q "vllm_cpu/serve.py"; then
    say "pid $pid is not a vLLM server started by start.sh; leaving it alone"
    rm -f "$PID_FILE"
    exit 0
  fi
  say "stopping vLLM (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
elif ! group_alive; then
  say "server (pid $pid) already gone"
  rm -f "$PID_FILE"
  exit 0
fi

deadline=$((SECONDS + STOP_TIMEOUT))
while group_alive && [ "$SECONDS" -lt "$deadline" ]; do
  sleep 0.5
done
if group_alive; then
  say "still running after $STOP_TIMEOUT s: SIGKILL to process group $pid"
  kill -KILL -- "-$pid" 2>/dev/null || true
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    group_alive || break
    sleep 0.5
  done
  if group_alive; then
    say "ERROR: processes of group $pid survive SIGKILL"
    exit 1
  fi
fi
rm -f "$PID_FILE"
say "stopped"
