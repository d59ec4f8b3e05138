#!/usr/bin/env bash
# Wall time and CPU of the README's main job (and optionally `switchyard bench`) on this tree
# beside an old revision, measured in one run, alternating old/new (issue 9's check item "the
# main job's wall time and bench's, measured as a ratio to the old ones in one run").
#
#   scripts/compare_wall.sh                  # old = e0e200f, 3 timed runs of each binary
#   scripts/compare_wall.sh [--bench] [OLD_REV] [N]
#       --bench   also time `switchyard bench --out <tmp dir>` (paper 003's figures), N runs each
#
# The default old revision, e0e200f ("validate --pool accepts a live pool file", 2026-12-01
# 12:23, itself a CLI fix for another issue): every line of work on issue 9 forks from it. The
# first commits that address the issue's items — e6729bd "One serving substrate for every
# policy" (item 1; its child b8880dc brings the vLLM start-up constants), 2df94ba "tokens: count
# with Qwen3's own tokenizer" (item 2) and e0d6fdf "joint: keep each node's timing P90 …" (the
# scale branch, item 3), all 2026-12-01 12:37–12:42 — each has e0e200f as its parent (see
# `git log --graph e0e200f..774db15`). It is the first-wave tree the issue describes ("180
# sessions 5.6 s CPU"; measured here on 2026-12-06: 9.6–9.9 s CPU): the light, uncalibrated workload (o200k token counts, 20 s + 2 GB/s
# cold starts, baselines without scale-out). It builds with today's toolchain (rustc 1.95;
# 18 min in release on 2 loaded cores).
#
# The old revision is checked out with `git worktree add --detach` under /tmp and built there in
# release with its own CARGO_TARGET_DIR under /tmp (both reused when present: delete them to
# rebuild); this tree's binary is `cargo build --release` here (target/release/switchyard, which
# reflects the working tree, not just HEAD: the script prints `git describe --dirty`; a tree in
# the middle of someone's edit may not build, then wait and rerun). Each
# binary runs from its own tree's root, so it reads its own workflows, datasets and pool. The
# old CLI takes the same command (`run A B C --json`, `bench --out DIR`) and prints the same
# JSON keys used here (makespan_s, sessions_total, sessions_completed), so nothing is adapted
# per binary. Before timing, one untimed main-job run per binary (WARMUP=0 skips it) fills the
# page cache and the WebAssembly CPython compile cache, which a first run after an install
# would otherwise pay (~13 s). Wall and CPU (user+sys, children included) come from GNU
# /usr/bin/time; the tables give medians over the N runs and the ratios new/old. Exit status 3
# of `run` (some sessions failed) is accepted and shows in the sessions column.
#
# Environment: OLD_WORKTREE, OLD_TARGET_DIR (default /tmp/switchyard-old-<rev>{,-target}),
# WARMUP (1). Needs git, cargo, jq and GNU time.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)

BENCH=0
args=()
for a in "$@"; do
  case "$a" in
    --bench) BENCH=1 ;;
    -h | --help) sed -n '2,8p' "$0"; exit 0 ;;
    *) args+=("$a") ;;
  esac
done
OLD_REV=${args[0]:-e0e200f}
N=${args[1]:-3}
WARMUP=${WARMUP:-1}
[[ "$N" =~ ^[1-9][0-9]*$ ]] || { echo "compare_wall.sh: N must be a positive integer, got '$N'" >&2; exit 2; }
command -v jq >/dev/null || { echo "compare_wall.sh: needs jq" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "compare_wall.sh: needs GNU time at /usr/bin/time" >&2; exit 1; }

old_sha=$(git rev-parse --verify --quiet "${OLD_REV}^{commit}") || { echo "compare_wall.sh: unknown revision $OLD_REV" >&2; exit 2; }
old_short=$(git rev-parse --short=7 "$old_sha")
OLD_WT=${OLD_WORKTREE:-/tmp/switchyard-old-$old_short}
OLD_TARGET=${OLD_TARGET_DIR:-/tmp/switchyard-old-$old_short-target}
OLD_BIN=$OLD_TARGET/release/switchyard
NEW_BIN=$REPO/target/release/switchyard

# --- build ------------------------------------------------------------------------------------
if [ ! -d "$OLD_WT" ]; then
  git worktree add --detach "$OLD_WT" "$old_sha" >&2
elif [ "$(git -C "$OLD_WT" rev-parse HEAD)" != "$old_sha" ]; then
  echo "compare_wall.sh: $OLD_WT holds $(git -C "$OLD_WT" rev-parse --short HEAD), not $old_short; remove it or set OLD_WORKTREE" >&2
  exit 1
fi
if [ ! -x "$OLD_BIN" ]; then
  echo "building $old_short in $OLD_WT (target $OLD_TARGET) ..." >&2
  (cd "$OLD_WT" && CARGO_TARGET_DIR="$OLD_TARGET" cargo build --release >&2)
fi
echo "building this tree (cargo build --release) ..." >&2
cargo build --release >&2

# --- measure ----------------------------------------------------------------------------------
work=$(mktemp -d /tmp/compare_wall.XXXXXX)
trap 'rm -rf "$work"' EXIT
MAIN=(run workflows/gsm8k.yaml workflows/mbpp.yaml workflows/qmsum.yaml --json)

# one_run LABEL JOB I: runs JOB (main|bench) with binary LABEL (old|new) from its tree's root;
# appends "wall cpu" to $work/LABEL.JOB.times and keeps the output as $work/LABEL.JOB.I.out.
one_run() {
  local label=$1 job=$2 i=$3 dir bin tf out rc
  if [ "$label" = old ]; then dir=$OLD_WT; bin=$OLD_BIN; else dir=$REPO; bin=$NEW_BIN; fi
  tf=$work/time; out=$work/$label.$job.$i.out
  local cmd=("${MAIN[@]}")
  [ "$job" = bench ] && cmd=(bench --out "$work/bench-$label-$i")
  rc=0
  (cd "$dir" && /usr/bin/time -f '%e %U %S' -o "$tf" "$bin" "${cmd[@]}" >"$out" 2>"$work/stderr") || rc=$?
  if [ "$rc" -ne 0 ] && ! { [ "$job" = main ] && [ "$rc" -eq 3 ]; }; then
    echo "compare_wall.sh: $label $job run $i exited $rc:" >&2; tail -5 "$work/stderr" >&2; exit 1
  fi
  # GNU time prefixes "Command exited with non-zero status" on failure: the last line is ours.
  tail -1 "$tf" | awk '{ printf "%s %.2f\n", $1, $2 + $3 }' >>"$work/$label.$job.times"
  [ "$job" = bench ] && rm -rf "$work/bench-$label-$i"
  echo "  $label $job run $i: $(tail -1 "$work/$label.$job.times") (wall s, cpu s)" >&2
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

new_desc=$(git describe --always --dirty --abbrev=7)
echo "compare_wall.sh $(date -u '+%Y-%m-%d %H:%M UTC') · $(nproc) cores · load average at start $(cut -d' ' -f1-3 /proc/loadavg)"
echo "old: $old_short ($OLD_BIN, run from $OLD_WT)"
echo "new: $new_desc ($NEW_BIN, run from $REPO)"
echo "N = $N timed runs per binary, alternating old/new; medians; CPU = user+sys incl. children"

jobs=(main)
[ "$BENCH" = 1 ] && jobs+=(bench)
for job in "${jobs[@]}"; do
  if [ "$job" = main ] && [ "$WARMUP" = 1 ]; then
    echo "warm-up (untimed) ..." >&2
    for label in old new; do
      (cd "$([ $label = old ] && echo "$OLD_WT" || echo "$REPO")" && \
        "$([ $label = old ] && echo "$OLD_BIN" || echo "$NEW_BIN")" "${MAIN[@]}" >/dev/null 2>&1) || true
    done
  fi
  echo "timing $job ..." >&2
  for i in $(seq 1 "$N"); do
    one_run old "$job" "$i"
    one_run new "$job" "$i"
  done
done

echo
echo "| job | binary | runs: wall s | median wall s | median CPU s | sessions (completed/total) | makespan s (virtual) | output identical across runs |"
echo "|---|---|---|---:|---:|---|---:|---|"
for job in "${jobs[@]}"; do
  for label in old new; do
    t=$work/$label.$job.times
    walls=$(cut -d' ' -f1 "$t" | paste -sd' ' | sed 's/ /, /g')
    mw=$(cut -d' ' -f1 "$t" | median); mc=$(cut -d' ' -f2 "$t" | median)
    printf -v "w_${label}_$job" '%s' "$mw"; printf -v "c_${label}_$job" '%s' "$mc"
    if [ "$job" = main ]; then
      read -r sc st ms < <(jq -r '"\(.sessions_completed) \(.sessions_total) \(.makespan_s)"' "$work/$label.main.1.out")
      sessions="$sc/$st"; makespan=$(printf '%.1f' "$ms")
      same=$(md5sum "$work/$label".main.*.out | cut -d' ' -f1 | sort -u | wc -l | awk '{ print ($1 == 1) ? "yes" : "no" }')
    else
      sessions=$(grep -o '[0-9]* simulations' "$work/$label.bench.1.out" | head -1 || true); makespan=-; same=-
    fi
    name=$old_short; [ "$label" = new ] && name=$new_desc
    echo "| $job | $label $name | $walls | $mw | $mc | $sessions | $makespan | $same |"
  done
done
echo
echo "| job | wall new/old | CPU new/old |"
echo "|---|---:|---:|"
for job in "${jobs[@]}"; do
  wo=w_old_$job; wn=w_new_$job; co=c_old_$job; cn=c_new_$job
  awk -v j="$job" -v wo="${!wo}" -v wn="${!wn}" -v co="${!co}" -v cn="${!cn}" \
    'BEGIN { printf "| %s | %.2f | %.2f |\n", j, wn / wo, cn / co }'
done
echo
echo "load average at end $(cut -d' ' -f1-3 /proc/loadavg)"
