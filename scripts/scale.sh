#!/usr/bin/env bash
# Simulator scale measurement (README "Simulator scale"): wall time, sessions/s and peak RSS of
# `switchyard run` (release) at 180 / 1,000 / 10,000 / 100,000 sessions in all.
#
#   scripts/scale.sh                 # all four sizes (100,000 takes many minutes; not a test)
#   scripts/scale.sh 180 1000        # some of them
#   WORKFLOWS="workflows/gsm8k.yaml workflows/qmsum.yaml" scripts/scale.sh 10000
#                                    # without MBPP: the simulator's cost without real tool runs
#
# 180 is the main job (60 sessions per workflow, burst, the paper pool). Larger sizes run on a
# pool scaled with the work (workflows/pools/scale-64.yaml up to 10,000 sessions,
# scale-256.yaml above) under Poisson arrivals of RATE sessions/s per workflow (default 0.2,
# which scale-64 should carry on the calibrated thinking workload; not checked to keep latencies flat). Needs GNU time (/usr/bin/time).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/switchyard}
WORKFLOWS=${WORKFLOWS:-"workflows/gsm8k.yaml workflows/mbpp.yaml workflows/qmsum.yaml"}
RATE=${RATE:-0.2}
[ -x "$BIN" ] || cargo build --release
read -r -a wfs <<<"$WORKFLOWS"
n_wf=${#wfs[@]}
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(180 1000 10000 100000)
printf '| sessions | workflows | pool | arrival | wall s | sessions/s | peak RSS MiB |\n|---:|---|---|---|---:|---:|---:|\n'
for total in "${sizes[@]}"; do
  per=$(( (total + n_wf - 1) / n_wf ))
  if [ "$total" -le 180 ]; then pool=workflows/pools/paper.yaml; arrival=burst
  elif [ "$total" -le 10000 ]; then pool=workflows/pools/scale-64.yaml; arrival="poisson:$RATE"
  else pool=workflows/pools/scale-256.yaml; arrival="poisson:$RATE"; fi
  tf=$(mktemp)
  /usr/bin/time -f '%e %M' -o "$tf" "$BIN" run "${wfs[@]}" --sessions "$per" --pool "$pool" \
    --arrival "$arrival" --json --allow-failures >/dev/null 2>/dev/null
  read -r wall rss <"$tf"; rm -f "$tf"
  n=$(( per * n_wf ))
  awk -v n="$n" -v w="$wall" -v r="$rss" -v wf="$(basename -a "${wfs[@]}" | sed 's/.yaml//' | paste -sd+)" \
    -v p="$(basename "$pool" .yaml)" -v a="$arrival" \
    'BEGIN { printf "| %d | %s | %s | %s | %.1f | %.1f | %.0f |\n", n, wf, p, a, w, n / w, r / 1024 }'
done
