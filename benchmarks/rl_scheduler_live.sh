#!/usr/bin/env bash
# Session 54's admission order live (docs/rl.md, "The admission order: a lever the agents do not hold"): the
# multi-tenant task (c) served live under each of SCHEDULERS (default: fcfs lpm), with the sim's prediction of every
# run beside it (benchmarks/rl_live.sh per scheduler): one GPU each at once where the host has as many, else in turn
# on GPU 0 (one H200: SCHEDULERS=fcfs, then SCHEDULERS=lpm in a second call, each about 450 s). Per scheduler: fixed 0.01, fixed 0.0 and
# one FCFS-trained agent (AGENT, default tenants-dqn50k-seed0) on SEEDS (default 0-9); LIVE_LIMIT_S per stage; EXTRA,
# LIVE_EXTRA as rl_live.sh (a CPU smoke test: SEEDS=[0] EXTRA=workload.max_requests=12
# LIVE_EXTRA="model=tiny backend.device=cpu live_warmup=2").
# Writes $OUT/scheduler_live.tgz ($OUT/<scheduler>/tenants/... and <scheduler>.log); then, here:
#   python scripts/rl_scheduler_table.py fcfs=D/fcfs/tenants/live/results.csv lpm=D/lpm/tenants/live/results.csv
#   (and the same with sim/results.csv: the prediction)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=${OUT:-/tmp/kvrl-out}; mkdir -p "$ROOT"
AGENT=${AGENT:-docs/results/agents/tenants-dqn50k-seed0}
read -ra scheds <<< "${SCHEDULERS:-fcfs lpm}"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
i=0; pids=()
for sched in "${scheds[@]}"; do
  CUDA_VISIBLE_DEVICES=$(( gpus >= ${#scheds[@]} ? i : 0 )) OUT=$ROOT/$sched SEEDS=${SEEDS:-[0,1,2,3,4,5,6,7,8,9]} LIVE_LIMIT_S=${LIVE_LIMIT_S:-480} \
    AGENTS_tenants=$AGENT BASELINES='baselines.watermark=[{name: fixed, fraction: 0.01},{name: fixed, fraction: 0.0}]' \
    EXTRA="sweep=[] scheduler=$sched ${EXTRA:-}" bash benchmarks/rl_live.sh tenants > "$ROOT/$sched.log" 2>&1 &
  pids+=($!); i=$((i + 1))
  [ "$gpus" -ge ${#scheds[@]} ] || wait "$!"
done
for pid in "${pids[@]}"; do wait "$pid"; done
for sched in "${scheds[@]}"; do tail -n 25 "$ROOT/$sched.log"; done
tar czf "$ROOT/scheduler_live.tgz" -C "$ROOT" "${scheds[@]}" "${scheds[@]/%/.log}"
