#!/usr/bin/env bash
# TAO admission inside the joint planner (README "TAO inside the joint planner"): the joint
# policy with and without `--no-tao-admission`, side by side on the same traces, over seeds.
#
#   scripts/tao-admission.sh            # seeds 1-5, the three workloads below
#   SEEDS="1 2" scripts/tao-admission.sh
#
# Workloads (burst, the paper pool): the ReAct agent alone (300 sessions), the ReAct agent
# mixed with the three paper pipelines (60 sessions each), and the three pipelines alone (the
# main job). Prints, per workload, the means over the seeds of makespan, p95 session latency and
# the share of prompt tokens served from the prefix cache, and the per-seed makespan change.
# Needs python3 (to read `switchyard run --json`).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/switchyard}
SEEDS=${SEEDS:-"1 2 3 4 5"}
[ -x "$BIN" ] || cargo build --release
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
run() { # name seed variant args...
  local name=$1 seed=$2 variant=$3
  shift 3
  local flag=()
  [ "$variant" = joint ] || flag=(--no-tao-admission)
  "$BIN" run "$@" --seed "$seed" --json "${flag[@]}" 2>/dev/null >"$out/$name.$seed.$variant.json"
}
for seed in $SEEDS; do
  for v in joint no-tao-admission; do
    run react "$seed" "$v" workflows/react.yaml --sessions 300
    run mixed "$seed" "$v" workflows/gsm8k.yaml workflows/mbpp.yaml workflows/qmsum.yaml workflows/react.yaml --sessions 60
    run pipelines "$seed" "$v" workflows/gsm8k.yaml workflows/mbpp.yaml workflows/qmsum.yaml --sessions 60
  done
done
python3 - "$out" $SEEDS <<'EOF'
import json, sys, statistics as st
d, seeds = sys.argv[1], sys.argv[2:]
print("| workload | variant | makespan s | p95 s | prefix-cache hits | makespan Δ per seed (TAO vs first-fit) |")
print("|---|---|---:|---:|---:|---|")
for w in ["react", "mixed", "pipelines"]:
    runs = {v: [json.load(open(f"{d}/{w}.{s}.{v}.json")) for s in seeds] for v in ["joint", "no-tao-admission"]}
    for r in runs.values():
        assert all(x["sessions_failed"] == 0 for x in r), f"{w}: a session failed"
    deltas = [100 * (a["makespan_s"] / b["makespan_s"] - 1) for a, b in zip(runs["joint"], runs["no-tao-admission"])]
    for v, r in runs.items():
        mk = st.mean(x["makespan_s"] for x in r)
        p95 = st.mean(x["latency_s"]["p95"] for x in r)
        hits = sum(x["cached_prompt_tokens"] for x in r) / max(1, sum(x["prompt_tokens"] for x in r))
        extra = " ".join(f"{x:+.1f} %" for x in deltas) if v == "joint" else ""
        print(f"| {w} | {v} | {mk:.1f} | {p95:.1f} | {100 * hits:.1f} % | {extra} |")
EOF
