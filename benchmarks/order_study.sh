#!/usr/bin/env bash
# Session 56's learned admission order (docs/rl.md, "A learned admission order"), sim, into docs/results/rl_scored/.
# Stages (default: val test merge other):
#   val     the hand-written orders on the val split (seeds 0-9, fixed 0.01): lpm, fcfs, sjf, fcfs with late requests
#           last, and lpm with late requests last and its prefill weight in {0, 0.25, 0.5, 1, 2, 4}: picks the
#           strongest hand-written order (HEUR below)
#   search  scripts/order_search.py, training seeds 0-2 (run on a lent machine's 16 host cores:
#           TASKS=tenants SEEDS="0 1 2" WORKERS=5 WALL_S=420 SEARCH_ARGS="--population 12 --elite 3 --windows 6
#           --generations 30" bash benchmarks/order_search_device.sh) -> docs/results/agents/tenants-scored-seedS;
#           and from the hand-written order: order_search.py --seed 10 --init 1,-1,0,0,-10 --init_std 0.1 (same
#           options, --max_wall_s 2100 --workers 2 on this machine; seeds 11 and 12 with SEEDS="11 12" WORKERS=7
#           WALL_S=220 and those SEARCH_ARGS on the lent host) -> docs/results/agents/tenants-scoredinit-seedS
#   test    kvrl-eval per order (ONLY: the names of the orders to serve, default all) on env=tenants (test seeds 0-39: 0-9 as every tenants leaderboard, 10-39 fresh) and
#           env=tenants_heldout (seeds 0-9), fixed 0.01: lpm, fcfs, sjf, the val-picked hand-written order, the
#           learned orders
#   merge   one leaderboard per family (scripts/merge_eval.py), paired against lpm and the val-picked order
#   other   the val-picked order (tuned on tenants, not retuned) on two other tasks, beside their first-come order:
#           throttle (test seeds 0-19, fixed 0.01, token_ratio(4096, 0.05) and ttft_slack) and pressure (heavy
#           preemption; seeds 0-9, fixed 0.01 and 0.0): kvrl-eval under each scheduler, one leaderboard per task; and
#           session 44's throttle_planner agents under the order beside the rules under it
#   bash benchmarks/order_study.sh [STAGE ...]      WORKERS processes (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
W=${WORKERS:-2}
OUT=docs/results/rl_scored
SEEDS=${SEEDS:-'[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39]'}
HSEEDS='[0,1,2,3,4,5,6,7,8,9]'
LATE="scheduler=scored scheduler.late=-10"
HEUR="$LATE scheduler.prefill=-1"              # the val pick of the val stage (lpm_late_p1)
declare -A ORDERS=([lpm]="scheduler=lpm" [fcfs]="scheduler=fcfs" [sjf]="scheduler=sjf" [lpm_late_p1]="$HEUR")
LEARNED=()                                     # the learned orders: searched from lpm, and from the hand-written order
for d in docs/results/agents/tenants-scored-seed* docs/results/agents/tenants-scoredinit-seed*; do
  [ -d "$d" ] || continue
  name=${d##*/tenants-}; name=${name/-/_}; LEARNED+=("$name")
  ORDERS[$name]=$(python3 scripts/order_search.py --overrides_of "$d")
done
mkdir -p "$OUT"
evaluate() {   # evaluate <env> <seeds> <name> <scheduler overrides> [baselines] [agents]: kvrl-eval (default: fixed 0.01
  local env=$1 seeds=$2 name=$3 sched=$4          # only, no agents) -> $OUT/<env>_<name>_results.csv
  local baselines=${5:-'baselines.watermark=[{name: fixed, fraction: 0.01}]'} agents=${6:-'agents=[]'}
  # shellcheck disable=SC2086  # the scheduler overrides are words
  python3 -m kvrl.apps.eval env="$env" $sched "$agents" "$baselines" \
    "seeds=$seeds" 'sweep=[]' tune=null plots=false workers="$W" "hydra.run.dir=runs/eval/scored_${env}_$name" > /dev/null
  cp "runs/eval/scored_${env}_$name/results.csv" "$OUT/${env}_${name}_results.csv"
}
for stage in "${@:-val test merge other}"; do
  for s in $stage; do
    case $s in
      val)
        rm -f "$OUT/val_orders.jsonl"
        (cd scripts && python3 rl_order_headroom.py --task tenants --split val --workers "$W" --out "../$OUT/val_orders.jsonl" \
          --serve "lpm=scheduler=lpm" "fcfs=scheduler=fcfs" "sjf=scheduler=sjf" \
                  "fcfs_late=scheduler=scored scheduler.cached=0 scheduler.wait=1 scheduler.late=-10" "lpm_late=$LATE" \
                  "lpm_late_p0.25=$LATE scheduler.prefill=-0.25" "lpm_late_p0.5=$LATE scheduler.prefill=-0.5" \
                  "lpm_late_p1=$LATE scheduler.prefill=-1" "lpm_late_p2=$LATE scheduler.prefill=-2" \
                  "lpm_late_p4=$LATE scheduler.prefill=-4") ;;
      search) echo "run on a lent machine: see the header"; exit 2 ;;
      test)
        for name in ${ONLY:-"${!ORDERS[@]}"}; do
          evaluate tenants "$SEEDS" "$name" "${ORDERS[$name]}"
          evaluate tenants_heldout "$HSEEDS" "$name" "${ORDERS[$name]}"
        done ;;
      merge)
        for env in tenants tenants_heldout; do
          shares=(); learned=()
          for name in lpm fcfs sjf lpm_late_p1 "${LEARNED[@]}"; do shares+=("$name=$OUT/${env}_${name}_results.csv"); done
          for name in "${LEARNED[@]}"; do learned+=(--learned "$name"); done
          python3 scripts/merge_eval.py --out "$OUT" --prefix "${env}_merged_" "${learned[@]}" \
            --title "$env: learned and hand-written admission orders at fixed 0.01, paired per seed" \
            --reference 'fixed(fraction=0.01) [lpm]' --reference 'fixed(fraction=0.01) [lpm_late_p1]' "${shares[@]}"
        done ;;
      other)
        evaluate throttle '[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19]' fcfs scheduler=fcfs \
          'baselines.watermark=[{name: fixed, fraction: 0.01},{name: token_ratio, clip_max_new_tokens: 4096, min_ratio: 0.05},{name: ttft_slack}]'
        evaluate throttle '[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19]' lpm_late_p1 "$HEUR" \
          'baselines.watermark=[{name: fixed, fraction: 0.01},{name: token_ratio, clip_max_new_tokens: 4096, min_ratio: 0.05},{name: ttft_slack}]'
        evaluate pressure "$HSEEDS" fcfs scheduler=fcfs 'baselines.watermark=[{name: fixed, fraction: 0.01},{name: fixed, fraction: 0.0}]'
        evaluate pressure "$HSEEDS" lpm_late_p1 "$HEUR" 'baselines.watermark=[{name: fixed, fraction: 0.01},{name: fixed, fraction: 0.0}]'
        python3 scripts/merge_eval.py --out "$OUT" --prefix throttle_merged_ --reference token_ratio \
          --title "throttle: the first-come order and the hand-written order of tenants, paired per seed" \
          "fcfs=$OUT/throttle_fcfs_results.csv" "lpm_late_p1=$OUT/throttle_lpm_late_p1_results.csv"
        # session 44's throttle_planner agents (trained under fcfs) served under the order, beside the rules under it
        evaluate throttle_planner '[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19]' agents_lpm_late_p1 "$HEUR" \
          'baselines.watermark=[{name: fixed, fraction: 0.01},{name: fixed, fraction: 0.0},{name: token_ratio, clip_max_new_tokens: 4096, min_ratio: 0.05},{name: ttft_slack}]' \
          'agents=[docs/results/agents/throttle_planner-rcpi-seed0,docs/results/agents/throttle_planner-rcpi-seed1,docs/results/agents/throttle_planner-rcpi-seed2]'
        python3 scripts/merge_eval.py --out "$OUT" --prefix throttle_planner_agents_lpm_late_p1_ --reference token_ratio \
          --title "throttle_planner: session 44's agents and the rules, all under the hand-written order, paired per seed" \
          "$OUT/throttle_planner_agents_lpm_late_p1_results.csv"
        python3 scripts/merge_eval.py --out "$OUT" --prefix pressure_merged_ --reference 'fixed(fraction=0.0)' \
          --title "pressure: the first-come order and the hand-written order of tenants, paired per seed" \
          "fcfs=$OUT/pressure_fcfs_results.csv" "lpm_late_p1=$OUT/pressure_lpm_late_p1_results.csv" ;;
      *) echo "unknown stage $s"; exit 2 ;;
    esac
  done
done
