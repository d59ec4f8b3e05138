#!/usr/bin/env bash
# Start llama-cpp-python's OpenAI-compatible server on a tiny GGUF model, in the background,
# and wait until it answers GET /v1/models with 200.
#
# Usage: start_server.sh MODEL.gguf PORT [LOGFILE] [-- EXTRA SERVER FLAGS...]
#   MODEL.gguf  made by make_tiny_gguf.py (created here if the file does not exist)
#   PORT        loopback port to listen on (127.0.0.1)
#   LOGFILE     server stdout+stderr (default: MODEL.gguf.PORT.log)
# Environment:
#   API_KEY         if set, passed as --api_key (every request then needs "Authorization: Bearer $API_KEY")
#   MODEL_ALIAS     model id served (default: tiny)
#   N_CTX           context length (default: 512)
#   START_TIMEOUT_S seconds to wait for readiness (default: 120)
# Prints the server's PID on stdout once it is ready; exits non-zero (and kills the server)
# if it is not ready in time or exits early. Stop it with: kill PID
set -euo pipefail

if [ $# -lt 2 ]; then
  sed -n '2,16p' "$0" >&2
  exit 2
fi
model=$1
port=$2
shift 2
log="${model}.${port}.log"
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
  log=$1
  shift
fi
if [ $# -gt 0 ] && [ "$1" = "--" ]; then shift; fi

here="$(cd "$(dirname "$0")" && pwd)"
if [ ! -f "$model" ]; then
  python3 "$here/make_tiny_gguf.py" "$model"
fi

args=(--model "$model" --model_alias "${MODEL_ALIAS:-tiny}" --host 127.0.0.1 --port "$port"
      --n_ctx "${N_CTX:-512}" --n_threads 1 --n_threads_batch 1 --seed 0
      # A new request must not cut off a running stream (the default, True, ends it with [DONE]).
      --interrupt_requests False --verbose False)
if [ -n "${API_KEY:-}" ]; then
  args+=(--api_key "$API_KEY")
fi

# The server's settings are pydantic BaseSettings: it also reads every setting from an
# environment variable of the same name (API_KEY, MODEL, N_CTX, PORT, VERBOSE, ...; any case),
# so an empty API_KEY would turn authentication on. Start it with a clean environment.
keep=()
for v in PATH HOME LANG LC_ALL TMPDIR PYTHONPATH VIRTUAL_ENV LD_LIBRARY_PATH PYENV_ROOT PYENV_VERSION; do
  if [ -n "${!v:-}" ]; then keep+=("$v=${!v}"); fi
done
env -i "${keep[@]}" python3 -m llama_cpp.server "${args[@]}" "$@" >"$log" 2>&1 &
pid=$!

API_KEY="${API_KEY:-}" python3 - "$port" "$pid" "${START_TIMEOUT_S:-120}" <<'EOF' || { kill "$pid" 2>/dev/null || true; echo "llama_cpp.server did not become ready; log: $log" >&2; tail -n 30 "$log" >&2 || true; exit 1; }
import os, sys, time, urllib.request
port, pid, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models")
if os.environ.get("API_KEY"):
    req.add_header("Authorization", "Bearer " + os.environ["API_KEY"])
deadline = time.time() + timeout
while time.time() < deadline:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit("server exited")
    try:
        with urllib.request.urlopen(req, timeout=2) as r:
            if r.status == 200:
                sys.exit(0)
    except Exception:
        pass
    time.sleep(0.2)
sys.exit("timeout")
EOF
echo "$pid"
