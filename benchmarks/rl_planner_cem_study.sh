#!/usr/bin/env bash
# The session-51/52 evaluation of the policy-search agents trained on throttle_planner_mix (docs/rl.md,
# "Whole episodes searched directly"), sim only, each a kvrl-eval with session 49's baselines and
# seeds, its files copied to docs/results/rl_throttle/<PREFIX>_<name>_* (PREFIX default planner_cem):
#   test      throttle_planner's test split, 60 seeds, against fixed 0.0, token_ratio(4096, 0.05), ttft_slack
#   heldout   throttle_planner_heldout, 20 seeds, every constant swept on val, the same rules
#   conv      throttle_planner_heldout_conv, 10 seeds, the same
# Runs on this checkout's Python (kvrl installed) or, on a lent GPU host, with benchmarks/device_env.sh
# sourced first (the GPU stays idle). WORKERS processes each (default 2; a 16-core host: 16);
# AGENTS: the agent directories (default sessions 51-52's seven: docs/results/agents/throttle_planner_mix-cem-seed0-2,
# -cemmean-seed0, -cemload-seed0-2). Session 53's gates: PREFIX=planner_gate AGENTS=[the gates and their base].
#   bash benchmarks/rl_planner_cem_study.sh [NAME ...]     # default: test heldout conv
set -euo pipefail
cd "$(dirname "$0")/.."
W=${WORKERS:-2}; P=${PREFIX:-planner_cem}
A=docs/results/agents/throttle_planner_mix
AGENTS=${AGENTS:-[$A-cem-seed0,$A-cem-seed1,$A-cem-seed2,$A-cemmean-seed0,$A-cemload-seed0,$A-cemload-seed1,$A-cemload-seed2]}
seeds() { python3 -c "print('[' + ','.join(map(str, range($1))) + ']')"; }
RULES='{name: token_ratio, clip_max_new_tokens: 4096, min_ratio: 0.05},{name: ttft_slack}'
run() {   # run <name> <kvrl-eval overrides...>
  local name=$1; shift
  local dir=runs/eval/${P}_$name
  python3 -m kvrl.apps.eval "$@" "agents=$AGENTS" plots=false workers="$W" hydra.run.dir="$dir"
  for f in leaderboard.csv leaderboard.md results.csv; do cp "$dir/$f" "docs/results/rl_throttle/${P}_${name}_$f"; done
}
study() {
  case $1 in
    test) run test env=throttle_planner "seeds=$(seeds 60)" tune=null oracle=false 'sweep=[]' \
      "baselines.watermark=[{name: fixed, fraction: 0.0},$RULES]" ;;
    heldout|conv) run "$1" "env=throttle_planner_heldout$([ "$1" = conv ] && echo _conv)" \
      "seeds=$(seeds $([ "$1" = conv ] && echo 10 || echo 20))" 'sweep=[0.0,0.01,0.05,0.1,0.2,0.3]' \
      "baselines.watermark=[{name: fixed, fraction: 0.01},$RULES]" ;;
    *) echo "unknown study $1 (test, heldout, conv)" >&2; exit 2 ;;
  esac
}
for name in "${@:-test heldout conv}"; do
  for n in $name; do study "$n"; done
done
