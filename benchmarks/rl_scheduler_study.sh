#!/usr/bin/env bash
# Session 54's admission-order study (docs/rl.md, "The admission order: a lever the agents do not hold"): does the order in
# which waiting requests are admitted leave room that the watermark does not, under memory pressure? For
# each task and scheduler, one kvrl-eval on the task's test split (10 seeds) serving the fixed watermarks
# of SWEEP on test (oracle=true: the hindsight-best constant of that scheduler), sim only; its files go to
# docs/results/rl_scheduler/<task>_<scheduler>_{leaderboard.csv,leaderboard.md,results.csv}.
# scripts/rl_scheduler_table.py then compares each scheduler's constants with fcfs's, paired per seed.
#   bash benchmarks/rl_scheduler_study.sh [TASK ...]      # default: pressure tenants tenants_heldout
# WORKERS processes each (default 2); on a lent GPU host source benchmarks/device_env.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."
W=${WORKERS:-2}
SWEEP=${SWEEP:-[0.0,0.01,0.03,0.05,0.1]}
SEEDS=${SEEDS:-[0,1,2,3,4,5,6,7,8,9]}
OUTDIR=docs/results/rl_scheduler
mkdir -p "$OUTDIR"
run() {   # run <task> <name> <scheduler overrides...>
  local task=$1 name=$2; shift 2
  local dir=runs/eval/scheduler_${task}_$name
  python3 -m kvrl.apps.eval "env=$task" "$@" 'agents=[]' "seeds=$SEEDS" "sweep=$SWEEP" fixed_best=0.01 \
    oracle=true tune=null 'baselines.watermark=[{name: fixed, fraction: 0.01}]' plots=false workers="$W" \
    hydra.run.dir="$dir"
  for f in leaderboard.csv leaderboard.md results.csv; do cp "$dir/$f" "$OUTDIR/${task}_${name}_$f"; done
}
for task in "${@:-pressure tenants tenants_heldout}"; do
  for t in $task; do
    run "$t" fcfs scheduler=fcfs
    run "$t" sjf scheduler=sjf scheduler.oracle=false
    run "$t" sjf_oracle scheduler=sjf scheduler.oracle=true
    case $t in tenants*)    # shared prefixes: longest cached prefix first, as shipped (FCFS past 128 waiting)
      run "$t" lpm scheduler=lpm                                # and without that fallback in these runs
      run "$t" lpm_q4096 scheduler=lpm scheduler.max_queue=4096 ;;
    esac
  done
done
