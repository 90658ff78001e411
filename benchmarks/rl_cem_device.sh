#!/usr/bin/env bash
# CPU-only: cross-entropy policy search (scripts/rl_cem.py) for several training seeds at once, on a
# lent GPU machine's 16 host cores (the GPU stays idle; docs/rl.md, "Length hints and policy search").
#
#   TASK=hinted BASE=0.03 SEEDS="0 1 2" bash benchmarks/rl_cem_device.sh
#   TASK=throttle_planner_mix BASE_ACTION=0 CEM_ARGS=--val-families bash benchmarks/rl_cem_device.sh
#
# Environment: TASK, BASE (the val-picked constant, a bin of the task) or BASE_ACTION (the base as an
# action index, for tasks whose actions are rules), SEEDS (training seeds, run in
# parallel), WORKERS (processes per seed, default 5), WALL_S (each run stops after the generation that
# passes it, default 420), CEM_ARGS (more rl_cem.py options), EXTRA (Hydra overrides of the task).
# Writes $OUT/cem_<task>.tar.gz: one agent directory per seed (best_model.zip, agent.json, cem.json)
# and each run's log.
set -uo pipefail
OUT=${OUT:-/tmp/kvrl-out}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
. benchmarks/device_env.sh
TASK=${TASK:?set TASK}
if [ -n "${BASE_ACTION:-}" ]; then base_arg="--base-action $BASE_ACTION"; else base_arg="--base ${BASE:?set BASE or BASE_ACTION}"; fi
SEEDS=${SEEDS:-0 1 2}; WORKERS=${WORKERS:-5}; WALL_S=${WALL_S:-420}
work=$(mktemp -d)
{ nproc; lscpu | grep 'Model name'; python3 --version; git log -1 --format='commit %h' 2>/dev/null; } > "$work/host.txt"
for s in $SEEDS; do
  # shellcheck disable=SC2086  # base_arg, CEM_ARGS and EXTRA are words
  python3 scripts/rl_cem.py --task "$TASK" $base_arg --seed "$s" --workers "$WORKERS" --max-wall-s "$WALL_S" \
    ${CEM_ARGS:-} --out "$work/$TASK-cem-seed$s" ${EXTRA:-} > "$work/$TASK-cem-seed$s.log" 2>&1 &
done
wait
tar -czf "$OUT/cem_$TASK.tar.gz" -C "$work" .
tail -n 3 "$work"/*.log
