#!/usr/bin/env bash
# The KV tiers under the prefix cache (#20) live on one GPU: Qwen3-0.6B shape (or, PRESET=llama, the
# Llama-3-8B shape), random bf16 weights drawn on the device, a multi-turn workload with a shared
# 1024-token system prompt whose working set is several times the (deliberately small) GPU pool;
# GPU-only prefix caching vs + a CPU tier (offload_all) vs + CPU and disk tiers (a CPU tier too small
# for the working set, the rest demoted to block files on local disk), the same workload in the sim
# (shipped H200 profile, disk priced from this machine's measured disk bandwidth) beside it.
#
#   bash benchmarks/tiers_live.sh                 # Qwen3-0.6B shape; ~4-6 min on an H200
#   PRESET=llama bash benchmarks/tiers_live.sh    # Llama-3-8B shape; sized for one call of <= 540 s
#
# Stages, each writing under $OUT:
#   1. versions: GPU, driver, python/torch/triton, commit; check: benchmarks/tiers_check.py (KV round
#      trips GPU -> pinned CPU tier -> disk files -> GPU bit-exact, greedy tokens equal with the tiers);
#      disk: the disk tier's bandwidth on $DISK_DIR ($OUT/disk_bandwidth.json).
#   2. sim:  scripts/tiers_study.py on the sim backend: $OUT/tiers_sim/{table.md,results.json}.
#   3. live: the same on the live executor: $OUT/tiers_live/{table.md,results.json} (tier_load_s and
#      tier_store_s measured with CUDA events on the swap stream). One executor for all variants,
#      built and warmed up once (WARMUP requests); table.md and results.json are rewritten after
#      every variant, so a live stage cut short by its limit keeps the variants that finished.
# Environment: PRESET (qwen, the default, or llama), MODEL (default qwen3-0.6b), SEEDS (default "0"),
# VARIANTS (default "gpu cpu disk"; also prefetch, disk_cost, disk_ra = disk with 64 blocks of disk read-ahead), TIER_BLOCKS (default 1024: 1.9 GB of pinned host memory for
# Qwen3-0.6B), DISK_BLOCKS (default 8192: 15 GB of block files), DISK_DIR (default /tmp/kvrl-disk-tier,
# removed at the end), WARMUP (default 64), TOTAL_LIMIT_S (default 530: the whole script's budget;
# the live stage gets what is left of it, at most LIVE_LIMIT_S, default 480), CHECK (default 1; 0
# skips the check), EXTRA (overrides for both stages), LIVE_EXTRA (live stage only).
#
# PRESET=llama (MODEL=llama-3-8b, TIER_BLOCKS=512: 1 GiB pinned, DISK_BLOCKS=4096): 120 conversations
# at 6/s, 1024-token system prompt, first message mean 384 (<= 768), user turns mean 96 (<= 256),
# answers mean 32 (<= 96), at most 4 turns, 8 s between turns, 192 GPU blocks of 16 tokens; working
# set 6.0x the GPU pool on average, peak 9.4x (seed 0). The sim (shipped H200 profile) keeps the GPU
# busy 33-34 s per variant (88 s makespan; idle time is skipped live), so the live stage needs about
# 1-2 min of build and warm-up plus ~1 min per variant; budget ~6-7 min for the whole call.
#
# CPU smoke test with the tiny model:
#   MODEL=tiny TIER_BLOCKS=16 DISK_BLOCKS=256 WARMUP=4 EXTRA="workload.num_conversations=12 workload.system_prompt_len=64 \
#     workload.first_prompt_len.mean=48 workload.user_turn_len.mean=16 workload.output_len.mean=8 \
#     engine.num_blocks=48" LIVE_EXTRA="backend.device=cpu" bash benchmarks/tiers_live.sh
set -uo pipefail
OUT=${OUT:-/tmp/kvrl-out}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
. benchmarks/device_env.sh
t0=$(date +%s)
PRESET=${PRESET:-qwen}
case "$PRESET" in
  qwen)  MODEL=${MODEL:-qwen3-0.6b}; TIER_BLOCKS=${TIER_BLOCKS:-1024}; DISK_BLOCKS=${DISK_BLOCKS:-8192}
         WORKLOAD=(workload.num_conversations=80 workload.arrival.rate=4.0 workload.system_prompt_len=1024
                   workload.first_prompt_len.mean=512 workload.user_turn_len.mean=128 workload.max_turns=8
                   workload.mean_turn_gap_s=3.0 engine.num_blocks=256) ;;
  llama) MODEL=${MODEL:-llama-3-8b}; TIER_BLOCKS=${TIER_BLOCKS:-512}; DISK_BLOCKS=${DISK_BLOCKS:-4096}
         WORKLOAD=(workload.num_conversations=120 workload.arrival.rate=6.0 workload.system_prompt_len=1024
                   workload.first_prompt_len.mean=384 workload.first_prompt_len.high=768 workload.user_turn_len.mean=96
                   workload.user_turn_len.high=256 workload.output_len.mean=32 workload.output_len.high=96
                   workload.max_turns=4 workload.mean_turn_gap_s=8.0 engine.num_blocks=192) ;;
  *) echo "PRESET must be qwen or llama, got '$PRESET'"; exit 2 ;;
esac
SEEDS=${SEEDS:-0}
VARIANTS=${VARIANTS:-gpu cpu disk}
DISK_DIR=${DISK_DIR:-/tmp/kvrl-disk-tier}
WARMUP=${WARMUP:-64}
TOTAL_LIMIT_S=${TOTAL_LIMIT_S:-530}
LIVE_LIMIT_S=${LIVE_LIMIT_S:-480}
CHECK=${CHECK:-1}
mkdir -p "$DISK_DIR"; trap 'rm -rf "$DISK_DIR"' EXIT
COMMON=(workload=multi_turn "${WORKLOAD[@]}" engine.block_size=16 progress=false plots=false ${EXTRA:-})
echo "=== preset $PRESET: model $MODEL, variants $VARIANTS, seeds $SEEDS, tier $TIER_BLOCKS, disk $DISK_BLOCKS blocks"

echo "=== versions ($(date -u +%FT%TZ))"
device_versions || exit 1

echo "=== check ($(date +%T))"
if [ "$CHECK" != 1 ]; then echo "skipped (CHECK=$CHECK)"
else
  if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then CHECK_DEV=cuda; else CHECK_DEV=cpu; fi
  timeout 300 python3 benchmarks/tiers_check.py "$CHECK_DEV" "$DISK_DIR" | tee "$OUT/tiers_check.json" || { echo "tier check failed"; exit 1; }
fi

echo "=== disk bandwidth ($(date +%T))"
timeout 300 python3 -c "
import json, sys
from kvrl.engine.disk_tier import measure_disk_bandwidth
print(json.dumps(measure_disk_bandwidth(sys.argv[1], block_bytes=2 << 20, num_blocks=128)))" "$DISK_DIR" \
  | tee "$OUT/disk_bandwidth.json" || { echo "disk bandwidth measurement failed"; exit 1; }

echo "=== sim ($(date +%T))"
timeout 300 python3 scripts/tiers_study.py --out "$OUT/tiers_sim" --seeds $SEEDS --variants $VARIANTS \
  --tier-blocks "$TIER_BLOCKS" --disk-blocks "$DISK_BLOCKS" --disk-bandwidth "$OUT/disk_bandwidth.json" -- backend=sim "model=$MODEL" "${COMMON[@]}" > "$OUT/tiers_sim.log" 2>&1
rc=$?; tail -n 8 "$OUT/tiers_sim.log"; [ $rc -eq 0 ] || { echo "sim stage failed (rc=$rc)"; exit $rc; }

left=$(( TOTAL_LIMIT_S - ($(date +%s) - t0) )); limit=$(( left < LIVE_LIMIT_S ? left : LIVE_LIMIT_S ))
echo "=== live ($(date +%T), limit ${limit} s)"
[ "$limit" -gt 0 ] || { echo "no time left for the live stage (TOTAL_LIMIT_S=$TOTAL_LIMIT_S)"; exit 124; }
timeout "$limit" python3 scripts/tiers_study.py --out "$OUT/tiers_live" --seeds $SEEDS --variants $VARIANTS \
  --tier-blocks "$TIER_BLOCKS" --disk-blocks "$DISK_BLOCKS" --warmup "$WARMUP" -- backend=live engine.disk_tier_dir="$DISK_DIR" "model=$MODEL" "${COMMON[@]}" ${LIVE_EXTRA:-} > "$OUT/tiers_live.log" 2>&1
rc=$?; tail -n 8 "$OUT/tiers_live.log"
echo "=== done in $(( $(date +%s) - t0 )) s (live rc=$rc); tables: $OUT/tiers_sim/table.md $OUT/tiers_live/table.md"
exit $rc
