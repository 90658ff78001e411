#!/usr/bin/env bash
# Regenerate every number of README.md and docs/ that comes from the sim, on this tree:
#   1. the sweeps of docs/sweeps.md (scripts/sweeps_docs.sh: docs/figures/sweeps/*, ~10-20 min on 2 cores);
#   2. the committed sim outputs that generated blocks and fact spans read (~15 min on 2 cores):
#      docs/rl.md's scenario tables (scripts/rl_scenario_table.py; the session-4 ones, docs/results.md's
#      session-4 leaderboards and the sim beside its live H200 run (kvrl-eval), on the archived
#      profile d5ff5ad, the task-suite regime on the profile shipped at 0ffecd4, which the suite's
#      results used, archived as kvrl/executors/profiles/archive/h200_qwen3-0.6b_bfloat16_0ffecd4.json, the
#      tenants and joint regimes on the fit-10 profile their leaderboards ran on, archived in session 32) and
#      docs/tiers.md's CPU/disk-tier and swap-prefetch studies (scripts/tiers_study.py, swap_prefetch_study.py)
#      and docs/security.md's
#      fill-and-squeeze and benign-cost runs (kvrl-attack, ~5 min);
#   3. every generated block and fact span (scripts/docs_tables.py update: README.md and docs/**/*.md,
#      `cheap` and `sim` kinds; a block names its command in its BEGIN marker, a fact span its source
#      in scripts/docs_facts.py, which reads the committed result files).
# Then `git diff` shows what moved. GPU runs are not re-run here: their tables are rendered from the
# committed result files (cheap blocks) or carry their command, device, versions and commit
# (see docs/design.md, "Documented numbers"). Not re-run either, each quoted with its command and
# commit: the RL task suite's kvrl-eval leaderboards (docs/results/rl_sim_suite, rl_classes,
# rl_sim_rcpi: minutes to hours of CPU each; their commands are beside their tables; run them on a
# many-core host) and the runs docs/rl.md and docs/results.md
# mark "not regenerable".
#
#   scripts/regen_docs.sh                 # everything
#   SKIP_SWEEPS=1 scripts/regen_docs.sh   # without step 1 (the sweeps' summaries as committed)
#   SKIP_RESULTS=1 scripts/regen_docs.sh  # without step 2 (the result files as committed)
#   PARALLEL=1 JOBS=8 EVAL_WORKERS=4 scripts/regen_docs.sh   # on a many-core host: steps 1 and 2's independent runs at once
#                                            # (each writes its own files; step 3 runs after all succeed)
set -euo pipefail
cd "$(dirname "$0")/.."
pids=()
step() {   # step <command...>: run now, or in the background with PARALLEL=1 (waited for before step 3)
  if [ -n "${PARALLEL:-}" ]; then "$@" & pids+=($!); else "$@"; fi
}
if [ -z "${SKIP_SWEEPS:-}" ]; then
  step scripts/sweeps_docs.sh
fi

rerun() {   # rerun <output file> <command...>: the command's stdout replaces the file only if it succeeds
  local out=$1; shift
  echo "running $* > $out" >&2
  "$@" > "$out.new" && mv "$out.new" "$out"
}

if [ -z "${SKIP_RESULTS:-}" ]; then
  scenario=docs/results/rl_scenario
  archived=backend.profile=archive/h200_qwen3-0.6b_bfloat16_d5ff5ad.json
  suite=backend.profile=archive/h200_qwen3-0.6b_bfloat16_0ffecd4.json
  step rerun $scenario/d5ff5ad/watermark.txt python scripts/rl_scenario_table.py "$archived"
  step rerun $scenario/d5ff5ad/preemption.txt python scripts/rl_scenario_table.py --task preemption "$archived"
  step rerun $scenario/pressure.txt python scripts/rl_scenario_table.py --task pressure --splits val,test "$suite"
  step rerun $scenario/phased.txt python scripts/rl_scenario_table.py --task phased --splits val,test "$suite"
  fit10=backend.profile=archive/h200_qwen3-0.6b_bfloat16_step_graphs_fit10.json   # the profile the tasks' leaderboards ran on
  step rerun $scenario/tenants.txt python scripts/rl_scenario_table.py --task tenants --splits val,test "$fit10"
  step rerun $scenario/joint.txt python scripts/rl_scenario_table.py --task joint --splits val,test "$fit10"
  live_sim() {   # the sim beside docs/results.md's live H200 watermark run
    local dir; dir=$(mktemp -d)
    python -m kvrl.apps.eval env=watermark "$archived" 'agents=[docs/results/agents/watermark-dqn]' 'seeds=[0,1]' \
      'baselines.watermark=[{name: fixed, fraction: 0.01},{name: token_ratio}]' fixed_best=0.01 tune=null \
      oracle=false workers=1 plots=false hydra.run.dir="$dir" > /dev/null
    cp "$dir/results.csv" docs/results/rl_live_h200_sim_results.csv
    rm -rf "$dir"
  }
  step live_sim
  session4() {   # session4 <name> <kvrl-eval overrides...>: docs/results.md's session-4 leaderboards (~8 min in all)
    local name=$1 dir=runs/regen/session4/$1; shift   # a fixed (ignored) run dir: leaderboard.md quotes the command
    rm -rf "$dir"
    python -m kvrl.apps.eval "$archived" tune=null oracle=false workers="${EVAL_WORKERS:-1}" plots=false hydra.run.dir="$dir" "$@" > /dev/null
    for f in leaderboard.csv leaderboard.md results.csv; do cp "$dir/$f" "docs/results/rl_session4/${name}_$f"; done
  }
  seeds20='seeds=[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19]'
  step session4 watermark env=watermark 'agents=[docs/results/agents/watermark-dqn]' "$seeds20" \
    'baselines.watermark=[{name: fixed, fraction: 0.01},{name: opt_factor},{name: avg_block_len},{name: token_ratio},{name: past_future}]'
  step session4 watermark_hindsight env=watermark 'agents=[docs/results/agents/watermark-dqn]' "$seeds20" \
    'baselines.watermark=[{name: fixed, fraction: 0.01}]' fixed_best=0.3
  step session4 preemption env=preemption 'agents=[docs/results/agents/preemption-maskable_ppo]' 'seeds=[0,1,2,3,4,5,6,7,8,9]' \
    'baselines.eviction=[{name: lifo},{name: lifo, mode: swap},{name: fewest_computed},{name: cost_aware}]'
  turns=(workload=multi_turn workload.system_prompt_len=1024 workload.first_prompt_len.mean=512
         workload.user_turn_len.mean=128 workload.max_turns=8)
  step python scripts/tiers_study.py --out docs/results/tiers/qwen3-0.6b --seeds 0 1 2 --tier-blocks 8192 -- \
    model=qwen3-0.6b "${turns[@]}" workload.num_conversations=200 workload.arrival.rate=4.0 \
    workload.mean_turn_gap_s=5.0 engine.num_blocks=512
  step python scripts/tiers_study.py --out docs/results/tiers/llama-3-8b --seeds 0 1 2 --tier-blocks 8192 -- \
    model=llama-3-8b "${turns[@]}" workload.num_conversations=150 workload.arrival.rate=1.0 \
    workload.mean_turn_gap_s=10.0 engine.num_blocks=448
  step python scripts/tiers_study.py --out docs/results/tiers/llama-3-8b_disk --seeds 0 1 2 \
    --variants gpu cpu disk prefetch disk_cost --tier-blocks 1024 --disk-blocks 8192 -- \
    model=llama-3-8b "${turns[@]}" workload.num_conversations=150 workload.arrival.rate=1.0 \
    workload.mean_turn_gap_s=10.0 engine.num_blocks=448
  step python scripts/tiers_study.py --out docs/results/tiers/qwen3-0.6b_disk --seeds 0 1 2 \
    --variants gpu cpu disk disk_cost --tier-blocks 1024 --disk-blocks 8192 -- \
    model=qwen3-0.6b "${turns[@]}" workload.num_conversations=200 workload.arrival.rate=4.0 \
    workload.mean_turn_gap_s=5.0 engine.num_blocks=512
  swap_prefetch() {   # docs/tiers.md's swap-in prefetching study (~2 min)
    local dir; dir=$(mktemp -d)
    python scripts/swap_prefetch_study.py --out "$dir" --seeds 0 1 2 3 4 > /dev/null
    cp "$dir"/{predictors.md,predictors.json,plugin.md,plugin.json,traces.json} docs/results/swap_prefetch/
    rm -rf "$dir"
  }
  step swap_prefetch
  attack=$(mktemp -d)
  fill_squeeze() {
    python -m kvrl.apps.attack fill-squeeze hydra.run.dir="$attack/fill" > /dev/null
    cp "$attack"/fill/fill_squeeze.json "$attack"/fill/fill_squeeze.md docs/results/security/
    cp "$attack"/fill/fill_squeeze.png docs/figures/fill_squeeze.png
  }
  step fill_squeeze
  benign() {   # benign <name> <overrides...>: kvrl-attack benign-cost's JSON and table as docs/results/security/<name>.*
    local name=$1; shift
    python -m kvrl.apps.attack benign-cost hydra.run.dir="$attack/$name" "$@" > /dev/null
    cp "$attack/$name/benign_cost.json" "docs/results/security/$name.json"
    cp "$attack/$name/benign_cost.md" "docs/results/security/$name.md"
  }
  step benign benign_cost_multi_tenant workload.rate_scale=3 engine.num_blocks=1024 engine.max_model_len=8192
  for rate in 6 12; do
    step benign "benign_cost_synthetic_rate$rate" workload=synthetic workload.num_requests=400 \
      workload.arrival.rate=$rate workload.output_len.mean=512 engine.num_blocks=512
  done
fi
for pid in "${pids[@]}"; do wait "$pid"; done   # PARALLEL=1: set -e stops here if any step failed
[ -z "${attack:-}" ] || rm -rf "$attack"
python scripts/docs_tables.py update
python scripts/docs_tables.py check
