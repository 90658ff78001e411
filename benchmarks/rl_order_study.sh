#!/usr/bin/env bash
# Session 55's adaptive admission order on the multi-tenant task (docs/rl.md, "Choosing the admission order while
# serving"), sim only, into docs/results/rl_order/. Stages (default: all but train, in this order):
#   val        lpm's fixed watermarks and the order bandit's settings on the val split (seeds 0-9): the watermark the
#              task's rules hold (conf/env/tenants_order.yaml) and the bandit's orders and epoch
#   headroom   scripts/rl_order_headroom.py on the test split: clairvoyant, --present, --present --blind --samples 4
#              (decisions every second, lpm at 0.01 the base), on tenants and tenants_heldout
#   bandit     kvrl-eval with scheduler=order_bandit (the val-picked setting) at fixed 0.01, tenants and tenants_heldout
#   train      kvrl-train env=tenants_order, DQN, seeds 0-2 (5,000 decisions; about 25 minutes each, the three
#              sharing 2 cores) -> docs/results/agents/tenants_order-dqn-seedS
#   agents     kvrl-eval env=tenants_order and env=tenants_order_heldout with the three agents and the lpm rule
#   merge      one leaderboard per task (scripts/merge_eval.py): lpm, fcfs, sjf (session 54's study files,
#              docs/results/rl_scheduler), the bandit and the agents, paired against lpm
#   bash benchmarks/rl_order_study.sh [STAGE ...]
# WORKERS processes (default 2). About 40 minutes here without train.
set -euo pipefail
cd "$(dirname "$0")/.."
W=${WORKERS:-2}
OUT=docs/results/rl_order
SEEDS='[0,1,2,3,4,5,6,7,8,9]'
AGENTS='[docs/results/agents/tenants_order-dqn-seed0,docs/results/agents/tenants_order-dqn-seed1,docs/results/agents/tenants_order-dqn-seed2]'
BANDIT=("scheduler=order_bandit" "scheduler.orders=[lpm,sjf]" "scheduler.epoch_s=2.0")
mkdir -p "$OUT"
headroom() { (cd scripts && python3 rl_order_headroom.py --epoch 1 --hold 1 --workers "$W" "$@"); }
# the scripts append their JSON lines to --out: each stage starts its files afresh
fresh() { rm -f "$@"; }
evaluate() {   # evaluate <name> <kvrl-eval overrides...>: results, leaderboard csv and md as <name>_*
  local name=$1; shift
  python3 -m kvrl.apps.eval "$@" "seeds=$SEEDS" 'sweep=[]' tune=null plots=false workers="$W" \
    "hydra.run.dir=runs/eval/order_$name"
  for f in results.csv leaderboard.csv leaderboard.md; do cp "runs/eval/order_$name/$f" "$OUT/${name}_$f"; done
}
merge() {      # merge <task> <order-run name> <bandit-run name>
  local task=$1 S=docs/results/rl_scheduler/$1
  python3 scripts/merge_eval.py --out "$OUT" --prefix "${task}_merged_" --title "$task: the admission order, paired per seed" \
    --reference 'fixed(fraction=0.01) [val-best, given] [lpm]' \
    --policy 'fixed(fraction=0.01) [val-best, given] [lpm]' --policy 'fixed(fraction=0.01) [val-best, given] [fcfs]' \
    --policy 'fixed(fraction=0.01) [val-best, given] [sjf]' --policy 'fixed(fraction=0.01) [order_bandit]' \
    --policy 'agent dqn (agents/tenants_order-dqn-seed0' --policy 'agent dqn (agents/tenants_order-dqn-seed1' \
    --policy 'agent dqn (agents/tenants_order-dqn-seed2' \
    "lpm=${S}_lpm_results.csv" "fcfs=${S}_fcfs_results.csv" "sjf=${S}_sjf_results.csv" \
    "order_bandit=$OUT/${3}_results.csv" "tenants_order=$OUT/${2}_results.csv"
}
for stage in "${@:-val headroom bandit agents merge}"; do
  for s in $stage; do
    case $s in
      val)
        fresh "$OUT/lpm_val_constants.jsonl" "$OUT/bandit_val.jsonl"
        (cd scripts && python3 rl_order_headroom.py --task tenants --split val --workers "$W" --out "../$OUT/lpm_val_constants.jsonl" \
          --serve "f0=scheduler=lpm fraction=0.0" "f0.01=scheduler=lpm fraction=0.01" "f0.03=scheduler=lpm fraction=0.03" \
                  "f0.05=scheduler=lpm fraction=0.05")
        b=()
        for orders in "3:[lpm,fcfs,sjf]" "2:[lpm,sjf]"; do for e in 0.5 1 2; do
          b+=("b${orders%%:*}_e$e=scheduler=order_bandit scheduler.orders=${orders#*:} scheduler.epoch_s=$e")
        done; done
        (cd scripts && python3 rl_order_headroom.py --task tenants --split val --workers "$W" --out "../$OUT/bandit_val.jsonl" \
          --serve "lpm=scheduler=lpm" "sjf=scheduler=sjf" "${b[@]}") ;;
      headroom)
        for t in tenants tenants_heldout; do
          p=$([ "$t" = tenants ] && echo "" || echo "heldout_")
          fresh "$OUT/${p}headroom.jsonl" "$OUT/${p}headroom_present.jsonl" "$OUT/${p}headroom_present_blind4.jsonl"
          headroom --task "$t" --out "../$OUT/${p}headroom.jsonl"
          headroom --task "$t" --present --out "../$OUT/${p}headroom_present.jsonl"
          headroom --task "$t" --present --blind --samples 4 --out "../$OUT/${p}headroom_present_blind4.jsonl"
        done ;;
      bandit)
        evaluate bandit env=tenants "${BANDIT[@]}" 'agents=[]' 'baselines.watermark=[{name: fixed, fraction: 0.01}]'
        evaluate bandit_heldout env=tenants_heldout "${BANDIT[@]}" 'agents=[]' 'baselines.watermark=[{name: fixed, fraction: 0.01}]' ;;
      train)
        for S in 0 1 2; do
          kvrl-train env=tenants_order agent=dqn seed=$S progress=false train.total_timesteps=5000 train.eval_every=1000 \
            train.checkpoint_every=1000 train.vec_env=dummy train.n_envs=1 train.torch_threads=1 train.max_wall_s=2400 \
            agent.kwargs.learning_starts=250 agent.kwargs.target_update_interval=125 agent.kwargs.exploration_fraction=0.3 \
            agent.kwargs.train_freq=2 hydra.run.dir=runs/train/tenants_order-dqn-seed$S &
        done
        wait
        for S in 0 1 2; do
          d=docs/results/agents/tenants_order-dqn-seed$S; mkdir -p "$d"
          cp runs/train/tenants_order-dqn-seed$S/{agent.json,best_model.zip,progress.csv,summary.json} "$d/"
        done ;;
      agents)
        evaluate agents env=tenants_order "agents=$AGENTS" 'baselines.watermark=[{name: ordered, order: lpm, fraction: 0.01}]'
        evaluate agents_heldout env=tenants_order_heldout "agents=$AGENTS" \
          'baselines.watermark=[{name: ordered, order: lpm, fraction: 0.01}]' ;;
      merge)
        merge tenants agents bandit
        merge tenants_heldout agents_heldout bandit_heldout ;;
      *) echo "unknown stage $s"; exit 2 ;;
    esac
  done
done
