#!/usr/bin/env bash
# Session 56's learned admission order (docs/rl.md, "A learned admission order"), sim, into docs/results/rl_scored/.
# Stages (default: val test merge):
#   val     the hand-written orders on the val split (seeds 0-9, fixed 0.01): lpm, fcfs, sjf, fcfs with late requests
#           last, and lpm with late requests last and its prefill weight in {0, 0.25, 0.5, 1, 2, 4}: picks the
#           strongest hand-written order (HEUR below)
#   search  scripts/order_search.py, training seeds 0-2 (run on a lent machine's 16 host cores:
#           TASKS=tenants SEEDS="0 1 2" WORKERS=5 WALL_S=420 SEARCH_ARGS="--population 12 --elite 3 --windows 6
#           --generations 30" bash benchmarks/order_search_device.sh) -> docs/results/agents/tenants-scored-seedS;
#           and from the hand-written order: order_search.py --seed S --init 1,-1,0,0,-10 --init_std 0.1 (same
#           options, --max_wall_s 2100 --workers 2 on this machine) -> docs/results/agents/tenants-scoredinit-seedS
#   test    kvrl-eval per order (ONLY: the names of the orders to serve, default all) on env=tenants (test seeds 0-39: 0-9 as every tenants leaderboard, 10-39 fresh) and
#           env=tenants_heldout (seeds 0-9), fixed 0.01: lpm, fcfs, sjf, the val-picked hand-written order, the
#           learned orders
#   merge   one leaderboard per family (scripts/merge_eval.py), paired against lpm and the val-picked order
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
evaluate() {   # evaluate <env> <seeds> <name> <overrides>: kvrl-eval at fixed 0.01 -> $OUT/<env>_<name>_results.csv
  local env=$1 seeds=$2 name=$3; shift 3
  # shellcheck disable=SC2068  # the overrides are words
  python3 -m kvrl.apps.eval env="$env" $@ 'agents=[]' 'baselines.watermark=[{name: fixed, fraction: 0.01}]' \
    "seeds=$seeds" 'sweep=[]' tune=null plots=false workers="$W" "hydra.run.dir=runs/eval/scored_${env}_$name" > /dev/null
  cp "runs/eval/scored_${env}_$name/results.csv" "$OUT/${env}_${name}_results.csv"
}
for stage in "${@:-val test merge}"; do
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
      *) echo "unknown stage $s"; exit 2 ;;
    esac
  done
done
