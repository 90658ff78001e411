#!/usr/bin/env bash
# kvrl-bench A/B on one GPU: an older tree of kvrl against this one, alternating (old, new, old, new, ...), so
# that both meet the same machine state; kvrl-bench alone varies ~10% between machines (docs/benchmarks.md).
# Prepare the older tree here (the device copy has no git history), then run this on the device:
#   mkdir ab_old && git archive <commit> kvrl kernels envs conf benchmarks pyproject.toml | tar -x -C ab_old \
#     && rm -rf ab_old/kvrl/executors/profiles/*.json ab_old/kvrl/executors/profiles/{archive,h200x4}
#   ROUNDS=3 OLD_ARGS="step_graphs=true" bash benchmarks/bench_ab.sh ab_old     # -> $OUT/summary.txt, one line a run
# OLD_ARGS / NEW_ARGS: kvrl-bench overrides of each side (a tree from before whole-step graphs were the default
# needs step_graphs=true to run what this tree runs by default).
set -uo pipefail
OLD=${1:?usage: bash benchmarks/bench_ab.sh OLD_TREE_DIR}
OUT=${OUT:-/tmp/kvrl-out}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
. benchmarks/device_env.sh > /dev/null
for d in kernels envs conf; do ln -sfn "../$d" "$OLD/kvrl/$d"; done   # the package-dir mapping, as device_env.sh
device_versions > "$OUT/versions.txt"
bench() {   # bench NAME DIR OVERRIDES: one kvrl-bench (kvrl only) from DIR's kvrl
  local name=$1 dir=$2 extra=$3
  ( cd "$dir" && PYTHONPATH="$PWD:${PYTHONPATH:-}" timeout 170 python3 -m kvrl.apps.bench "systems=[kvrl]" \
      "hydra.run.dir=$OUT/$name" $extra ) > "$OUT/$name.log" 2>&1
  echo "$name $(grep '^| kvrl ' "$OUT/$name.log")" | tee -a "$OUT/summary.txt"
}
for ((i = 1; i <= ${ROUNDS:-3}; i++)); do
  bench "old$i" "$OLD" "${OLD_ARGS:-}"
  bench "new$i" . "${NEW_ARGS:-}"
done
