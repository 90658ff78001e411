#!/usr/bin/env bash
# Session 56's learned admission order live (docs/rl.md, "A learned admission order"): the multi-tenant task's test
# jobs (conf/fidelity_set/tenants.yaml, seeds as kvrl-eval serves them) through the live executor and the sim, at
# fixed 0.01, under lpm, the val-picked hand-written order (lpm with late requests last, prefill weight 1) and the
# learned `scored` orders of docs/results/agents/tenants-scored-seed{0,1,2}: every live run with the sim's
# prediction of the same job beside it (kvrl-fidelity), then each order paired against lpm and the hand-written one.
#   WORKLOADS='[tenants_s0,...,tenants_s4]' bash benchmarks/order_live.sh      -> $OUT/order_live.tgz
# Environment: WORKLOADS (default all ten), SEEDS (the learned orders' training seeds, default "0 1 2"; one H200 serves
# ten workloads under three orders in one call: SEEDS=2), LIMIT_S (default 560), FID_ARGS (more kvrl-fidelity overrides; a CPU
# smoke test: FID_ARGS="model=tiny live.device=cpu max_requests=8 warmup_requests=2").
set -uo pipefail
cd "$(dirname "$0")/.."
. benchmarks/device_env.sh
ROOT=${OUT:-/tmp/kvrl-out}; mkdir -p "$ROOT"
PROFILE=kvrl/executors/profiles/h200_qwen3-0.6b_bfloat16_step_graphs.json
RUN=$ROOT/order_live
REST='watermark: {name: fixed, fraction: 0.01}, eviction: {name: lifo, mode: recompute}, prefix_cache: {name: hash_lru}'
policies=("+policies.lpm={scheduler: {name: lpm}, $REST}"
          "+policies.lpm_late_p1={scheduler: {name: scored, late: -10, prefill: -1}, $REST}")
names=(lpm lpm_late_p1)
for s in ${SEEDS:-0 1 2}; do
  sched=$(python3 -c "import json; c = json.load(open('docs/results/agents/tenants-scored-seed$s/scheduler.json')); \
print('{' + ', '.join(f'{k}: {v}' for k, v in c.items()) + '}')")
  policies+=("+policies.scored$s={scheduler: $sched, $REST}"); names+=("scored$s")
done
device_versions | tee "$ROOT/versions.txt"
timeout "${LIMIT_S:-560}" python3 -m kvrl.apps.fidelity +fidelity_set=tenants "only_workloads=${WORKLOADS:-[$(seq -s, -f tenants_s%g 0 9)]}" \
  "${policies[@]}" "only_policies=[$(IFS=,; echo "${names[*]}")]" "profile=$PROFILE" live_repeats=1 warmup_requests=64 \
  max_live_wall_s=40 plots=false "hydra.run.dir=$RUN" ${FID_ARGS:-} > "$ROOT/fidelity.log" 2>&1
echo "kvrl-fidelity rc $?" | tee -a "$ROOT/fidelity.log"
for p in "${names[@]:1}"; do
  python3 scripts/fidelity_policy_pairs.py "$RUN/fidelity.csv" --policy "$p" --baseline lpm
done | tee "$ROOT/pairs.md"
rm -rf "$RUN"/*/*/live/replay.csv 2>/dev/null
tar czf "$ROOT/order_live.tgz" -C "$ROOT" order_live fidelity.log versions.txt pairs.md
