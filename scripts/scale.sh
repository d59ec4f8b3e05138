#!/usr/bin/env bash
# Simulator scale measurement (README "Simulator scale"): wall time, sessions/s and peak RSS of
# `switchyard run` (release) at 180 / 1,000 / 10,000 / 100,000 sessions in all, and from the
# run's `--json` whether the pool sustains the arrivals: the makespan (first arrival to last
# end, virtual seconds) beside the arrival span, the p95 session latency and the failed sessions.
#
#   scripts/scale.sh                 # all four sizes (100,000 takes many minutes; not a test)
#   scripts/scale.sh 180 1000        # some of them
#   WORKFLOWS="workflows/gsm8k.yaml workflows/qmsum.yaml" scripts/scale.sh 10000
#                                    # without MBPP: the simulator's cost without real tool runs
#   ARRIVAL_TRACE=1 scripts/scale.sh 1000
#                                    # the exact arrival span, from the run's `--trace` (then
#                                    # wall time and RSS include writing the trace)
#   TOOL_CACHE=DIR scripts/scale.sh 10000
#                                    # `--tool-cache DIR`: sandboxed test runs kept on disk; a
#                                    # second run of the same size takes them from there
#
# 180 is the main job (60 sessions per workflow, burst, the paper pool). Larger sizes run on a
# pool scaled with the work (workflows/pools/scale-64.yaml up to 10,000 sessions,
# scale-256.yaml above) under Poisson arrivals of RATE sessions/s per workflow (default 0.2).
# Without ARRIVAL_TRACE the arrival span printed is the expected one, sessions per workflow /
# RATE, marked `~` (0 for a burst). A pool sustains the arrivals when the makespan stays close
# to the arrival span and the p95 latency does not grow with the session count.
# Needs GNU time (/usr/bin/time) and jq.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/switchyard}
WORKFLOWS=${WORKFLOWS:-"workflows/gsm8k.yaml workflows/mbpp.yaml workflows/qmsum.yaml"}
RATE=${RATE:-0.2}
ARRIVAL_TRACE=${ARRIVAL_TRACE:-0}
TOOL_CACHE=${TOOL_CACHE:-}
command -v jq >/dev/null || { echo "scripts/scale.sh: needs jq" >&2; exit 1; }
[ -x "$BIN" ] || cargo build --release
read -r -a wfs <<<"$WORKFLOWS"
n_wf=${#wfs[@]}
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(180 1000 10000 100000)
printf '| sessions | workflows | pool | arrival | wall s | sessions/s | peak RSS MiB | makespan s | arrival span s | p95 latency s | failed |\n'
printf '|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n'
for total in "${sizes[@]}"; do
  per=$(( (total + n_wf - 1) / n_wf ))
  if [ "$total" -le 180 ]; then pool=workflows/pools/paper.yaml; arrival=burst
  elif [ "$total" -le 10000 ]; then pool=workflows/pools/scale-64.yaml; arrival="poisson:$RATE"
  else pool=workflows/pools/scale-256.yaml; arrival="poisson:$RATE"; fi
  tf=$(mktemp); jf=$(mktemp); trf=$(mktemp)
  trace=()
  [ "$ARRIVAL_TRACE" = 1 ] && trace=(--trace "$trf")
  [ -n "$TOOL_CACHE" ] && trace+=(--tool-cache "$TOOL_CACHE")
  /usr/bin/time -f '%e %M' -o "$tf" "$BIN" run "${wfs[@]}" --sessions "$per" --pool "$pool" \
    --arrival "$arrival" --json --allow-failures "${trace[@]}" >"$jf" 2>/dev/null
  read -r wall rss <"$tf"
  read -r makespan p95 failed < <(jq -r '"\(.makespan_s) \(.latency_s.p95) \(.sessions_failed)"' "$jf")
  if [ "$ARRIVAL_TRACE" = 1 ]; then
    # Arrivals are logged in time order: the span is the last one's time less the first's.
    span=$(grep -F '"event":"arrival"' "$trf" | jq -s 'if length == 0 then 0 else (.[-1].t - .[0].t) end' | xargs printf '%.0f')
  elif [ "$arrival" = burst ]; then span=0
  else span=$(awk -v n="$per" -v r="$RATE" 'BEGIN { printf "~%.0f", n / r }'); fi
  rm -f "$tf" "$jf" "$trf"
  n=$(( per * n_wf ))
  awk -v n="$n" -v w="$wall" -v r="$rss" -v wf="$(basename -a "${wfs[@]}" | sed 's/.yaml//' | paste -sd+)" \
    -v p="$(basename "$pool" .yaml)" -v a="$arrival" -v m="$makespan" -v s="$span" -v l="$p95" -v f="$failed" \
    'BEGIN { printf "| %d | %s | %s | %s | %.1f | %.1f | %.0f | %.0f | %s | %.1f | %d |\n", n, wf, p, a, w, n / w, r / 1024, m, s, l, f }'
done
