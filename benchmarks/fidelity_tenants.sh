#!/usr/bin/env bash
# Session 55's fidelity case (docs/fidelity.md, "Runs 68-69"): the multi-tenant task's test jobs
# (conf/fidelity_set/tenants.yaml: env=tenants test seeds as kvrl-eval serves them) through the live executor
# and the sim under fcfs (kvrl-fidelity's vllm policy) and lpm, every live step recorded and priced by the shipped
# H200 profile (runs/<workload>/<policy>/replay.csv, with the step's prefix reads), then the residuals per step kind
# (scripts/fidelity_residuals.py). Session 54 measured the sim 2% high under fcfs and 12% high under lpm on these jobs
# (docs/results/rl_live_h200/scheduler_s54). Then the two policies paired over the workloads, live and in the sim
# (scripts/fidelity_policy_pairs.py). One H200: seeds 2, 4, 8, 9 twice each about 5 minutes with a cold model load.
#   WORKLOADS='[tenants_s2,tenants_s4,tenants_s8,tenants_s9]' bash benchmarks/fidelity_tenants.sh   # run 68
#   REPEATS=1 bash benchmarks/fidelity_tenants.sh                                                      # run 69
#   -> $OUT/fidelity_tenants.tgz
# Environment: WORKLOADS (default all ten, [tenants_s0,...,tenants_s9]), REPEATS (live runs per pair, default 2: the
# live-vs-live noise floor), LIMIT_S (default 500), FID_ARGS (more kvrl-fidelity overrides; a CPU smoke
# test: FID_ARGS="model=tiny live.device=cpu max_requests=8 warmup_requests=2").
set -uo pipefail
cd "$(dirname "$0")/.."
. benchmarks/device_env.sh
ROOT=${OUT:-/tmp/kvrl-out}; mkdir -p "$ROOT"
PROFILE=kvrl/executors/profiles/h200_qwen3-0.6b_bfloat16_step_graphs.json
RUN=$ROOT/fidelity_tenants
device_versions | tee "$ROOT/versions.txt"
timeout "${LIMIT_S:-500}" python3 -m kvrl.apps.fidelity +fidelity_set=tenants "only_workloads=${WORKLOADS:-[$(seq -s, -f tenants_s%g 0 9)]}" \
  '+policies.lpm={scheduler: {name: lpm}, watermark: {name: fixed, fraction: 0.01}, eviction: {name: lifo, mode: recompute}, prefix_cache: {name: hash_lru}}' \
  'only_policies=[vllm,lpm]' "profile=$PROFILE" "live_repeats=${REPEATS:-2}" warmup_requests=64 max_live_wall_s=40 \
  plots=false "hydra.run.dir=$RUN" ${FID_ARGS:-} > "$ROOT/fidelity.log" 2>&1
echo "kvrl-fidelity rc $?" | tee -a "$ROOT/fidelity.log"
tail -n 60 "$RUN/fidelity.md" 2>/dev/null
python3 scripts/fidelity_residuals.py --run "$RUN" --before "$PROFILE" --out "$ROOT/residuals" && cat "$ROOT/residuals.md"
python3 scripts/fidelity_policy_pairs.py "$RUN/fidelity.csv" --policy lpm --baseline vllm | tee "$ROOT/pairs.md"
tar czf "$ROOT/fidelity_tenants.tgz" -C "$ROOT" fidelity_tenants fidelity.log versions.txt $(cd "$ROOT" && ls residuals.* pairs.md 2>/dev/null)
