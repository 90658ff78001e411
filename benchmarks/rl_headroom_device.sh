#!/usr/bin/env bash
# CPU-only: rollout-planner headroom runs (scripts/rl_rule_headroom.py) side by side on a lent GPU
# machine's host cores (the GPU stays idle; docs/rl.md, "A planner that averages its guesses and does
# not know when traffic stops").
#
#   RUNS='throttle_fc5_blind_k32|--task throttle --rule token_ratio:clip_max_new_tokens=4096,min_ratio=0.05 ...' \
#     bash benchmarks/rl_headroom_device.sh
#
# Environment: RUNS, one run per line, "NAME|ARGS" (ARGS: the script's options and overrides, without
# --out, which is NAME.EXT); WALL_S (default 540: every run is stopped then, keeping the jobs it
# finished: --out is written as each job ends); SCRIPT (default scripts/rl_rule_headroom.py; also
# scripts/rl_rcpi.py collect with EXT=npz: guessed-rollout collection, docs/rl.md "An agent that
# imitates the planner"); EXT (default jsonl).
# Writes $OUT/headroom.tar.gz: each run's NAME.EXT and NAME.log, and host.txt.
set -uo pipefail
OUT=${OUT:-/tmp/kvrl-out}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
. benchmarks/device_env.sh
RUNS=${RUNS:?set RUNS}; WALL_S=${WALL_S:-540}; SCRIPT=${SCRIPT:-scripts/rl_rule_headroom.py}; EXT=${EXT:-jsonl}
work=$(mktemp -d)
{ nproc; lscpu | grep 'Model name'; python3 --version; python3 -c 'import torch; print("torch", torch.__version__)'; } > "$work/host.txt"
while IFS='|' read -r name args; do
  [ -n "$name" ] || continue
  # shellcheck disable=SC2086  # ARGS are words
  # shellcheck disable=SC2086  # SCRIPT may be a script and its subcommand
  timeout -k 10 "$WALL_S" python3 $SCRIPT $args --out "$work/$name.$EXT" > "$work/$name.log" 2>&1 &
done <<< "$RUNS"
wait
tar -czf "$OUT/headroom.tar.gz" -C "$work" .
ls -l "$work"
tail -n 2 "$work"/*.log
