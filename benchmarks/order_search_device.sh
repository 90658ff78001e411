#!/usr/bin/env bash
# CPU-only: the learned admission order (scripts/order_search.py, the cross-entropy method over the `scored`
# scheduler's weights) for several tasks and training seeds at once, on a lent GPU machine's host cores (the GPUs
# stay idle; docs/rl.md, "A learned admission order").
#
#   TASKS="tenants throttle" SEEDS="0 1 2" WORKERS=20 WALL_S=420 bash benchmarks/order_search_device.sh
#
# Environment: TASKS, SEEDS (all run in parallel), WORKERS (processes per run), WALL_S (each run stops after the
# generation that passes it), SEARCH_ARGS (more order_search.py options).
# Writes $OUT/order_search.tgz: one directory per task and seed (scheduler.json, search.json) and each run's log.
set -uo pipefail
OUT=${OUT:-/tmp/kvrl-out}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
. benchmarks/device_env.sh
work=$(mktemp -d)
{ nproc; lscpu | grep 'Model name'; python3 --version; } > "$work/host.txt"
for t in ${TASKS:-tenants}; do
  for s in ${SEEDS:-0 1 2}; do
    # shellcheck disable=SC2086  # SEARCH_ARGS are words
    python3 scripts/order_search.py --task "$t" --seed "$s" --workers "${WORKERS:-10}" --max_wall_s "${WALL_S:-420}" \
      ${SEARCH_ARGS:-} --out "$work/$t-scored-seed$s" > "$work/$t-scored-seed$s.log" 2>&1 &
  done
done
wait
tar -czf "$OUT/order_search.tgz" -C "$work" .
tail -n 2 "$work"/*.log
