#!/usr/bin/env bash
# calibrate.sh's pressure set (8 workloads x 2 policies x 3 live runs; docs/fidelity.md) split over the
# GPUs of one host: one kvrl-fidelity process per GPU, each on its share of the workloads (round robin,
# in the order of PRESSURE_WORKLOADS), then the shares' fidelity.json merged into one run and the per-pair
# comparison against the live mean (scripts/fidelity_compare.py). Output under $OUT:
#   pressure_<i>/          GPU share i's kvrl-fidelity directory (fidelity.md/json, runs/ for resim=)
#   pressure/fidelity.json the shares merged; pressure_compare.{md,csv} the per-pair errors, targets and
#                          policy rankings against the live means (scripts/fidelity_compare.py)
#   profile/               with PRE_PROFILE=1, the last GPU first re-profiles the shape on this host;
#   same_host_pressure*/   then the same live runs re-priced with that profile (scripts/fidelity_resim_shares.py),
#                          the comparison's second column (docs/fidelity.md, "A profile of the host at hand")
#   <name>.log             every process's output
# Usage: GPU_IDS="0 1 2 3" bash benchmarks/fidelity_pressure_gpus.sh [more kvrl-fidelity overrides]
# Knobs: MODEL (qwen3-0.6b), DTYPE (bfloat16), DEV (auto), PROFILE (select, kvrl-fidelity's default: each GPU
#   share's kvrl-fidelity chooses, among every matching profile, the one closest on its first pair's first live run;
#   auto: the shipped profile; or a profile.json),
#   LIMIT_S (each share's cap from the start, its profile included, 480 s; a share cut short keeps the
#   pairs it finished), PRE_PROFILE (0),
#   PRESSURE_WORKLOADS (calibrate.sh's eight; their order sets the shares), MAX_LIVE_WALL_S (40),
#   PROF_ARGS (more kvrl-profile overrides for PRE_PROFILE), SIM_ENSEMBLE (16: each sim prediction the mean of 16
#   runs with the profile's step-time jitter, the deterministic one kept as sim_deterministic; docs/fidelity.md,
#   "Runs 58-60"; 1: the deterministic sim alone).
# Llama-3-8B (docs/fidelity.md runs 35 and 39): MODEL=llama-3-8b MAX_LIVE_WALL_S=60, max_requests=200, and
#   PROF_ARGS="grid.prefix_cached=[1024,4096] grid.holdout=30" as calibrate.sh's profile_llama.
# A CPU smoke test: GPU_IDS="0 1" MODEL=tiny DTYPE=float32 DEV=cpu PRESSURE_WORKLOADS=[poisson,preempt_heavy] \
#   bash benchmarks/fidelity_pressure_gpus.sh max_requests=8 warmup_requests=0 live_repeats=1
set -uo pipefail
OUT=${OUT:-/tmp/kvrl-out}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
. benchmarks/device_env.sh
MODEL=${MODEL:-qwen3-0.6b}; DTYPE=${DTYPE:-bfloat16}; DEV=${DEV:-auto}; PROFILE=${PROFILE:-select}
LIMIT_S=${LIMIT_S:-480}; PRE_PROFILE=${PRE_PROFILE:-0}
PRESSURE_WORKLOADS=${PRESSURE_WORKLOADS:-"[poisson,preempt_heavy,code_trace_tight,code_trace_offline,long_outputs_swap,prefix_evict,tenants_pressure,bursty_tight]"}
read -r -a GPUS <<< "${GPU_IDS:-0}"
IFS=, read -r -a WORKLOADS <<< "${PRESSURE_WORKLOADS//[\[\] ]/}"
n=${#GPUS[@]}
deadline=$((SECONDS + LIMIT_S))
device_versions
for ((i = 0; i < n; i++)); do
  share=(); for ((j = i; j < ${#WORKLOADS[@]}; j += n)); do share+=("${WORKLOADS[j]}"); done
  [ ${#share[@]} -gt 0 ] || continue
  list=$(IFS=,; echo "${share[*]}")
  (
    export CUDA_VISIBLE_DEVICES=${GPUS[i]}
    if [ "$PRE_PROFILE" = 1 ] && [ "$i" = $((n - 1)) ]; then
      echo "=== GPU ${GPUS[i]}: profile ($(date +%T))"
      timeout 300 python3 -m kvrl.apps.profile_app "model=$MODEL" "backend.dtype=$DTYPE" "backend.device=$DEV" \
        "hydra.run.dir=$OUT/profile" ${PROF_ARGS:-} > "$OUT/profile.log" 2>&1
      echo "=== GPU ${GPUS[i]}: profile rc=$?"
    fi
    left=$((deadline - SECONDS)); [ "$left" -gt 0 ] || left=1   # timeout 0 would mean no limit
    echo "=== GPU ${GPUS[i]}: [$list] ($(date +%T), ${left} s left)"
    timeout "$left" python3 -m kvrl.apps.fidelity "model=$MODEL" "live.dtype=$DTYPE" "live.device=$DEV" \
      "profile=$PROFILE" "only_workloads=[$list]" warmup_requests=64 "max_live_wall_s=${MAX_LIVE_WALL_S:-40}" \
      live_repeats=3 plots=false "sim_ensemble=${SIM_ENSEMBLE:-16}" "hydra.run.dir=$OUT/pressure_$i" "$@" \
      > "$OUT/pressure_$i.log" 2>&1
    echo "=== GPU ${GPUS[i]}: [$list] rc=$? ($(date +%T))"
  ) &
done
wait
# the shares merged (and, with PRE_PROFILE=1, re-priced offline with this host's profile: CPU, seconds);
# the served sim's column is named after PROFILE: shipped (auto), selected (select) or given (a path)
label=given; [ "$PROFILE" = auto ] && label=shipped; [ "$PROFILE" = select ] && label=selected
if [ "$PRE_PROFILE" = 1 ] && [ -f "$OUT/profile/profile.json" ]; then
  python3 scripts/fidelity_resim_shares.py "$OUT" "same_host=$OUT/profile/profile.json"
  python3 scripts/fidelity_compare.py "$label=$OUT/pressure" "same_host=$OUT/same_host_pressure" --out "$OUT/pressure_compare"
else
  python3 scripts/fidelity_resim_shares.py "$OUT"
  python3 scripts/fidelity_compare.py "$label=$OUT/pressure" --out "$OUT/pressure_compare"
fi
cat "$OUT/pressure_compare.md"
