#!/usr/bin/env bash
# The session-16 length-hint study (docs/rl.md, "Length hints and direct policy search"), sim only,
# every run a kvrl-eval on the test split with its files copied to docs/results/rl_hinted/<name>_*:
#   exact                 env=hinted with exact hints: the no-preemption admission (past_future key=hint)
#   overcommit_sigma{0.0,0.5}  the same with overcommit tuned on val, exact and s = 0.5 hints
#   pressure_exact        the same (exact hints, overcommit tuned) in the unsaturated env=pressure, 10 seeds
#   victim_sigma{0.5,0.0}      the victim rules of classes_preemption with and without hint keys
#   cem                   the three CEM agents against every val-tuned heuristic and the oracle constant
#   cem_heldout           the same agents on env=hinted_heldout (10 seeds)
# About 25 minutes on 2 shared cores (WORKERS=2); a many-core host: WORKERS=16.
#   bash benchmarks/rl_hinted_study.sh [NAME ...]     # default: all of them
set -euo pipefail
cd "$(dirname "$0")/.."
W=${WORKERS:-2}
S20='[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19]'
S10='[0,1,2,3,4,5,6,7,8,9]'
AGENTS='[docs/results/agents/hinted-cem-seed0,docs/results/agents/hinted-cem-seed1,docs/results/agents/hinted-cem-seed2]'
VICTIMS='[{name: lifo},{name: slo_slack, mode: swap, pace: 0.5},{name: slo_slack, mode: swap, pace: 0.5, key: hint},{name: longest_remaining, mode: swap},{name: longest_remaining, mode: swap, key: hint},{name: most_blocks, mode: swap}]'
HEURISTICS='[{name: fixed, fraction: 0.01},{name: opt_factor},{name: avg_block_len},{name: token_ratio},{name: past_future, key: hint},{name: pi},{name: bandit}]'
run() {   # run <name> <kvrl-eval overrides...>
  local name=$1; shift
  local dir=runs/eval/rl_hinted_$name
  kvrl-eval "$@" plots=false workers="$W" hydra.run.dir="$dir"
  for f in leaderboard.csv leaderboard.md results.csv; do cp "$dir/$f" "docs/results/rl_hinted/${name}_$f"; done
}
study() {
  case $1 in
    exact) run exact env=hinted workload.length_hint_sigma=0.0 'agents=[]' "seeds=$S20" fixed_best=0.03 tune=null oracle=false \
      'baselines.watermark=[{name: fixed, fraction: 0.0},{name: past_future, key: hint, min_history: 1, quantile: 0.5}]' ;;
    overcommit_sigma0.0|overcommit_sigma0.5) run "$1" env=hinted "workload.length_hint_sigma=${1#overcommit_sigma}" 'agents=[]' \
      "seeds=$S20" 'sweep=[0.0,0.01,0.03,0.05,0.1]' 'baselines.watermark=[{name: past_future, key: hint, min_history: 1}]' \
      'tune.watermark={past_future: {quantile: [0.5, 0.9], min_history: [1]}}' \
      '++tune.watermark.past_future.overcommit=[0.0,0.1,0.25,0.5,1.0,2.0]' 'tune_seeds=[0,1,2]' oracle=false ;;
    pressure_exact) run pressure_exact env=pressure workload.length_hint_sigma=0.0 'agents=[]' "seeds=$S10" \
      'sweep=[0.0,0.01,0.03,0.05,0.1]' 'baselines.watermark=[{name: past_future, key: hint, min_history: 1}]' \
      'tune.watermark={past_future: {quantile: [0.5, 0.9], min_history: [1]}}' \
      '++tune.watermark.past_future.overcommit=[0.0,0.1,0.25,0.5,1.0]' 'tune_seeds=[0,1,2]' oracle=true ;;
    victim_sigma0.5|victim_sigma0.0) run "$1" env=classes_preemption "workload.length_hint_sigma=${1#victim_sigma}" 'agents=[]' \
      "seeds=$S10" "baselines.eviction=$VICTIMS" tune=null oracle=false ;;
    cem) run cem env=hinted "agents=$AGENTS" "seeds=$S20" 'sweep=[0.0,0.01,0.03,0.05,0.1,0.2,0.3]' \
      "baselines.watermark=$HEURISTICS" 'tune.watermark.past_future={quantile: [0.05, 0.2, 0.5, 0.9], min_history: [1, 20]}' \
      'tune_seeds=[0,1,2]' ;;
    cem_heldout) run cem_heldout env=hinted_heldout "agents=$AGENTS" "seeds=$S10" 'sweep=[0.0,0.01,0.03,0.05,0.1,0.2,0.3]' \
      'baselines.watermark=[{name: fixed, fraction: 0.01},{name: past_future, key: hint},{name: pi},{name: bandit}]' \
      'tune.watermark={past_future: {quantile: [0.5, 0.9], min_history: [1]}, pi: {setpoint: [0.0, 0.1]}, bandit: {epoch_s: [1.0, 4.0]}}' \
      'tune_seeds=[0,1]' ;;
    *) echo "unknown study $1" >&2; exit 2 ;;
  esac
}
names=("$@"); [ ${#names[@]} -gt 0 ] || names=(exact overcommit_sigma0.0 overcommit_sigma0.5 pressure_exact victim_sigma0.5 victim_sigma0.0 cem cem_heldout)
for n in "${names[@]}"; do study "$n"; done
