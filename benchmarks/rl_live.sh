#!/usr/bin/env bash
# Live evaluation of the committed sim-trained watermark agents on one GPU (an H200), scenario by
# scenario, with the sim's prediction beside every live number (docs/rl.md, "Live").
#
#   bash benchmarks/rl_live.sh                     # pressure and phased (conf/env/*.yaml), 10 seeds each
#   bash benchmarks/rl_live.sh pressure            # one scenario
#   bash benchmarks/rl_live.sh watermark           # the Azure-code task with docs/results/agents/watermark-dqn
#
# Per scenario, each stage writing under $OUT/<scenario>/:
#   1. sim:  kvrl-eval on the sim backend (the shipped H200 profile) with exactly the policies and
#            seeds of the live stage: the prediction, and the live wall-time estimate (live serves
#            in real time, so a run costs about its engine time).
#   2. live: kvrl-eval backend=live, the val-picked fixed watermark taken from the sim stage
#            (its val sweep over all seeds, passed on as fixed_best, so every GPU share serves the
#            same constant; no GPU time spent sweeping val), no val tuning and no oracle sweep.
#   3. compare.md (scripts/rl_live_compare.py): per policy, sim and live goodput (mean ± 95% CI over
#            seeds) side by side, and the paired per-seed difference to fixed 0.01 in both with its
#            verdict, and whether the signs agree where the sim's difference is significant.
# Policies: the scenario's agents (every training seed: no cherry-picking), fixed 0.01, the
# val-best fixed watermark (picked in the sim), the pi controller at its defaults: 6 policies x 10
# seeds = 60 live runs of 6.5 s (pressure) to 8.5 s (phased) of engine time, 7-9 minutes per
# scenario with model load and warm-up (the sim stage prints the estimate).
# Environment: SEEDS (default [0,...,9]); AGENTS_<scenario> (a comma-separated list; default every
# docs/results/agents/<scenario>-*/ directory, for watermark docs/results/agents/watermark-dqn);
# BASELINES (a kvrl-eval baselines.watermark list); LIVE_LIMIT_S (default 600, per scenario: the
# live stage is stopped after that; the sim table and the live runs it finished stay); EXTRA (more
# overrides for both stages) and LIVE_EXTRA (live stage only); GPUS (default 1: more splits the seeds over that many GPUs, one
# kvrl-eval each, in parallel); GPU_IDS (the devices those are, default 0,1,...: e.g. GPU_IDS=1,2,3 with GPUS=3
# leaves GPU 0 to another script on the same machine); REFERENCE (the policy the paired differences are taken against,
# default fixed 0.01; e.g. lifo for the eviction tasks). The eviction task (d) on 8 GPUs:
#   GPUS=8 REFERENCE=lifo AGENTS_classes_preemption=docs/results/agents/classes-slot-seed0 \
#     BASELINES='baselines.eviction=[{name: lifo},{name: slo_slack, mode: swap, pace: 0.5},{name: most_blocks, mode: swap}]' \
#     bash benchmarks/rl_live.sh classes_preemption
# With GPUS > 1 the GPU shares are also merged into $OUT/<scenario>/live_leaderboard.{csv,md} and
# live_results.csv; seeds served over several calls join the same way with scripts/merge_eval.py
# (docs/rl.md, "slo_shift live on an H200").
# On a host of four H200s, KVRL_PROFILE_PATH=kvrl/executors/profiles/h200x4 prices the sim stage with that host class's
# profile (docs/fidelity.md, "Runs 37-40"). The sim beside every live run chooses its own profile: of every matching
# one (h200x4/ included), the one that prices the process's first live run's steps closest (docs/fidelity.md, "Runs 44-45").
# A CPU smoke test with the tiny model:
#   SEEDS=[0] EXTRA="workload.max_requests=12 sweep=[0.0,0.2]" \
#     LIVE_EXTRA="model=tiny backend.device=cpu live_warmup=2" bash benchmarks/rl_live.sh pressure
set -uo pipefail
OUT=${OUT:-/tmp/kvrl-out}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
. benchmarks/device_env.sh
SCENARIOS=("$@"); [ ${#SCENARIOS[@]} -gt 0 ] || SCENARIOS=(pressure phased)
SEEDS=${SEEDS:-[0,1,2,3,4,5,6,7,8,9]}
LIVE_LIMIT_S=${LIVE_LIMIT_S:-600}
GPUS=${GPUS:-1}
BASELINES=${BASELINES:-'baselines.watermark=[{name: fixed, fraction: 0.01},{name: pi}]'}
PLOTS=false; python3 -c "import matplotlib" 2>/dev/null && PLOTS=true
t0=$(date +%s)

echo "=== versions ($(date -u +%FT%TZ))"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -2
python3 -c "import sys, torch, gymnasium, stable_baselines3 as sb3; print('python', sys.version.split()[0], 'torch', torch.__version__, 'gymnasium', gymnasium.__version__, 'sb3', sb3.__version__)" || exit 1
git log -1 --format='commit %h %s' 2>/dev/null || true

status=0
for sc in "${SCENARIOS[@]}"; do
  var="AGENTS_${sc}"; agents=${!var:-}
  if [ -z "$agents" ]; then
    if [ "$sc" = watermark ]; then agents=docs/results/agents/watermark-dqn
    else agents=$(ls -d docs/results/agents/"$sc"-*/ 2>/dev/null | sed 's:/$::' | paste -sd, -); fi
  fi
  [ -n "$agents" ] || { echo "no agents for scenario $sc (set AGENTS_$sc)"; status=2; continue; }
  dir="$OUT/$sc"; mkdir -p "$dir"
  COMMON=(env="$sc" "agents=[$agents]" "seeds=$SEEDS" "$BASELINES" tune=null oracle=false "plots=$PLOTS" ${EXTRA:-})
  echo "=== $sc: sim ($(date +%T)); agents: $agents"
  timeout 900 python3 -m kvrl.apps.eval "${COMMON[@]}" backend=sim workers=4 "hydra.run.dir=$dir/sim" \
    > "$dir/sim.log" 2>&1
  rc=$?; tail -n 20 "$dir/sim.log"; [ $rc -eq 0 ] || { echo "$sc: sim stage failed (rc=$rc)"; status=$rc; continue; }
  python3 - "$dir/sim/results.csv" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["split"] == "test"]
engine_s = sum(float(r["duration_s"]) for r in rows)
print(f"estimate: {len(rows)} live test runs, {engine_s:.0f} s of engine time in the sim; "
      f"live wall about {engine_s * 1.1 + 60:.0f} s (+10% host overhead, ~60 s model load, graph capture, warm-up)")
PY
  # the val-best constant is picked once, by the sim stage over all seeds: every live share serves that one
  # (each share's own val_pick=sim sweep would run on its share of the seeds and could pick another)
  PICK=()
  if [[ " ${EXTRA:-} " != *" fixed_best="* && " ${EXTRA:-} " != *" sweep=[] "* ]]; then
    best=$(python3 -c 'import csv, re, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["kind"] == "val-best" and r["split"] == "test"]
m = re.match(r"fixed\(fraction=([^)]+)\)", rows[0]["policy"]) if rows else None
print(m.group(1) if m else "")' "$dir/sim/results.csv")
    [ -n "$best" ] && PICK=("fixed_best=$best") && echo "val-best constant (sim, all seeds): $best"
  fi
  echo "=== $sc: live ($(date +%T)) on $GPUS GPU(s)"
  if [ "$GPUS" -le 1 ]; then
    timeout "$LIVE_LIMIT_S" python3 -m kvrl.apps.eval "${COMMON[@]}" backend=live val_pick=sim workers=1 "${PICK[@]}" ${LIVE_EXTRA:-} \
      "hydra.run.dir=$dir/live" > "$dir/live.log" 2>&1
    rc=$?; tail -n 20 "$dir/live.log"; [ $rc -eq 0 ] || { echo "$sc: live stage rc=$rc"; status=$rc; }
    live_csvs="$dir/live/results.csv"
  else
    # one kvrl-eval per GPU, each serving every policy on its share of the seeds (a seed's policies
    # all run on one GPU, so the paired differences stay paired)
    shares=($(python3 -c "import sys, yaml; s = yaml.safe_load(sys.argv[1]); n = int(sys.argv[2])
print(' '.join('[' + ','.join(map(str, s[i::n])) + ']' for i in range(min(n, len(s)))))" "$SEEDS" "$GPUS"))
    IFS=, read -ra ids <<< "${GPU_IDS:-$(seq -s, 0 $((GPUS - 1)))}"
    i=0; pids=(); live_csvs=""
    for share in "${shares[@]}"; do
      CUDA_VISIBLE_DEVICES=${ids[$i]} timeout "$LIVE_LIMIT_S" python3 -m kvrl.apps.eval "${COMMON[@]}" "seeds=$share" backend=live \
        val_pick=sim workers=1 "${PICK[@]}" ${LIVE_EXTRA:-} "hydra.run.dir=$dir/live_g$i" > "$dir/live_g$i.log" 2>&1 &
      pids+=($!); live_csvs="$live_csvs${live_csvs:+,}$dir/live_g$i/results.csv"; i=$((i + 1))
    done
    for k in "${!pids[@]}"; do
      wait "${pids[$k]}"; rc=$?; echo "--- GPU $k (seeds ${shares[$k]}): rc=$rc"; tail -n 3 "$dir/live_g$k.log"
      [ $rc -eq 0 ] || { echo "$sc: live stage on GPU $k rc=$rc"; status=$rc; }
    done
  fi
  # a live stage stopped by LIVE_LIMIT_S leaves the runs it finished in results.partial.csv (kvrl-eval's journal)
  csvs=""; for f in ${live_csvs//,/ }; do
    p=${f%results.csv}results.partial.csv
    if [ -f "$f" ]; then csvs="$csvs${csvs:+,}$f"
    elif [ -f "$p" ]; then echo "$sc: $f missing (stopped); using the runs it finished, $p"; csvs="$csvs${csvs:+,}$p"
    else echo "$sc: a live stage wrote no results"; fi
  done
  live_csvs=$csvs; [ -n "$live_csvs" ] || continue
  if [ "$GPUS" -gt 1 ]; then   # the GPU shares as one leaderboard: $dir/live_{results,leaderboard}.csv, live_leaderboard.md
    python3 scripts/merge_eval.py --out "$dir" --prefix live_ --reference "${REFERENCE:-fixed(fraction=0.01)}" \
      --title "$sc live ($GPUS GPU shares)" ${live_csvs//,/ } || status=1
  fi
  python3 scripts/rl_live_compare.py "$dir/sim/results.csv" "$live_csvs" "$sc" ${REFERENCE:+--reference "$REFERENCE"} > "$dir/compare.md"
  cat "$dir/compare.md"
done
echo "=== done in $(( $(date +%s) - t0 )) s; per scenario: $OUT/<scenario>/{sim,live}/leaderboard.md and compare.md"
exit $status
