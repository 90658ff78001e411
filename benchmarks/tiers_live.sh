#!/usr/bin/env bash
# The CPU tier under the prefix cache (#20) live on one GPU: Qwen3-0.6B shape, random bf16 weights,
# a multi-turn workload with a shared 1024-token system prompt whose working set is several times
# the (deliberately small) GPU pool; GPU-only prefix caching vs + a CPU tier (offload_all), the same
# workload in the sim (shipped H200 profile) beside it. ~2-3 min on an H200.
#
#   bash benchmarks/tiers_live.sh        # on the GPU machine; results under $OUT
#
# Stages, each writing under $OUT:
#   1. versions: GPU, driver, python/torch/triton, commit.
#   2. sim:  scripts/tiers_study.py on the sim backend: $OUT/tiers_sim/{table.md,results.json}.
#   3. live: the same on the live executor: $OUT/tiers_live/{table.md,results.json} (tier_load_s and
#      tier_store_s measured with CUDA events on the swap stream).
# Environment: MODEL (default qwen3-0.6b), SEEDS (default "0"), VARIANTS (default "gpu cpu"),
# TIER_BLOCKS (default 4096: 7.5 GB of pinned host memory for Qwen3-0.6B), LIVE_LIMIT_S (default 300),
# EXTRA (overrides for both stages), LIVE_EXTRA (live stage only). CPU smoke test with the tiny model:
#   MODEL=tiny TIER_BLOCKS=256 EXTRA="workload.num_conversations=12 workload.system_prompt_len=64 \
#     workload.first_prompt_len.mean=48 workload.user_turn_len.mean=16 workload.output_len.mean=8 \
#     engine.num_blocks=48" LIVE_EXTRA="backend.device=cpu" bash benchmarks/tiers_live.sh
set -uo pipefail
OUT=${OUT:-/tmp/kvrl-out}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
. benchmarks/device_env.sh
MODEL=${MODEL:-qwen3-0.6b}
SEEDS=${SEEDS:-0}
VARIANTS=${VARIANTS:-gpu cpu}
TIER_BLOCKS=${TIER_BLOCKS:-4096}
LIVE_LIMIT_S=${LIVE_LIMIT_S:-300}
COMMON=(workload=multi_turn workload.num_conversations=80 workload.arrival.rate=4.0 workload.system_prompt_len=1024
        workload.first_prompt_len.mean=512 workload.user_turn_len.mean=128 workload.max_turns=8
        workload.mean_turn_gap_s=3.0 engine.num_blocks=256 engine.block_size=16 progress=false plots=false ${EXTRA:-})
t0=$(date +%s)

echo "=== versions ($(date -u +%FT%TZ))"
device_versions || exit 1

echo "=== sim ($(date +%T))"
timeout 300 python3 scripts/tiers_study.py --out "$OUT/tiers_sim" --seeds $SEEDS --variants $VARIANTS \
  --tier-blocks "$TIER_BLOCKS" -- backend=sim "model=$MODEL" "${COMMON[@]}" > "$OUT/tiers_sim.log" 2>&1
rc=$?; tail -n 8 "$OUT/tiers_sim.log"; [ $rc -eq 0 ] || { echo "sim stage failed (rc=$rc)"; exit $rc; }

echo "=== live ($(date +%T))"
timeout "$LIVE_LIMIT_S" python3 scripts/tiers_study.py --out "$OUT/tiers_live" --seeds $SEEDS --variants $VARIANTS \
  --tier-blocks "$TIER_BLOCKS" -- backend=live "model=$MODEL" "${COMMON[@]}" ${LIVE_EXTRA:-} > "$OUT/tiers_live.log" 2>&1
rc=$?; tail -n 8 "$OUT/tiers_live.log"
echo "=== done in $(( $(date +%s) - t0 )) s (live rc=$rc); tables: $OUT/tiers_sim/table.md $OUT/tiers_live/table.md"
exit $rc
