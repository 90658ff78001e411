#!/usr/bin/env bash
# Live evaluation of the committed sim-trained watermark agent on one GPU (an H200), in the
# watermark task's scenario (conf/env/watermark.yaml: Qwen3-0.6B shape, random bf16 weights,
# 1,024 KV blocks, Azure code trace test split at 20x, TTFT <= 2 s, TPOT <= 5 ms).
#
#   bash benchmarks/rl_live.sh            # on the GPU machine; carry .whl (hydra, gymnasium, SB3 wheels)
#
# Stages, each writing under $OUT:
#   1. sim:  the same evaluation on the sim backend (the shipped H200 profile): the reference
#            table, and the estimate of the live wall time (live serves in real time, so a run
#            costs about its engine time).
#   2. live: kvrl-eval backend=live, the val-picked fixed watermark taken from the sim
#            (val_pick=sim: no GPU time spent sweeping val), $SEEDS seeds, policies: the agent,
#            fixed 0.01, the val-best fixed watermark, token_ratio.
# Environment: SEEDS (default [0,1]), AGENT (default docs/results/agents/watermark-dqn),
# LIVE_LIMIT_S (default 420: the live stage is stopped after that, the sim table stays), EXTRA
# (more overrides for both stages) and LIVE_EXTRA (live stage only), e.g. for a CPU smoke test:
#   EXTRA="workload.max_requests=20 sweep=[0.0,0.3]" LIVE_EXTRA="model=tiny backend.device=cpu" bash benchmarks/rl_live.sh
set -uo pipefail
OUT=${OUT:-/tmp/kvrl-out}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
. benchmarks/device_env.sh
SEEDS=${SEEDS:-[0,1]}
AGENT=${AGENT:-docs/results/agents/watermark-dqn}
LIVE_LIMIT_S=${LIVE_LIMIT_S:-420}
BASELINES='baselines.watermark=[{name: fixed, fraction: 0.01},{name: token_ratio}]'
PLOTS=false; python3 -c "import matplotlib" 2>/dev/null && PLOTS=true
COMMON=(env=watermark model=qwen3-0.6b device=h200 "agents=[$AGENT]" "seeds=$SEEDS" "$BASELINES" "plots=$PLOTS" ${EXTRA:-})
t0=$(date +%s)

echo "=== versions ($(date -u +%FT%TZ))"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -2
python3 -c "import sys, torch, gymnasium, stable_baselines3 as sb3; print('python', sys.version.split()[0], 'torch', torch.__version__, 'gymnasium', gymnasium.__version__, 'sb3', sb3.__version__)" || exit 1
git log -1 --format='commit %h %s' 2>/dev/null || true

echo "=== sim ($(date +%T))"
timeout 240 python3 -m kvrl.apps.eval "${COMMON[@]}" backend=sim workers=4 "hydra.run.dir=$OUT/rl_sim" \
  > "$OUT/rl_sim.log" 2>&1
rc=$?; tail -n 25 "$OUT/rl_sim.log"; [ $rc -eq 0 ] || { echo "sim stage failed (rc=$rc)"; exit $rc; }
python3 - "$OUT/rl_sim/results.csv" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["split"] == "test"]
engine_s = sum(float(r["duration_s"]) for r in rows)
print(f"estimate: {len(rows)} live test runs, {engine_s:.0f} s of engine time in the sim; "
      f"live wall about {engine_s * 1.1 + 60:.0f} s (+10% host overhead, ~60 s model load, graph capture, warm-up)")
PY

echo "=== live ($(date +%T))"
timeout "$LIVE_LIMIT_S" python3 -m kvrl.apps.eval "${COMMON[@]}" backend=live val_pick=sim workers=4 ${LIVE_EXTRA:-} \
  "hydra.run.dir=$OUT/rl_live" > "$OUT/rl_live.log" 2>&1
rc=$?; tail -n 25 "$OUT/rl_live.log"
echo "=== done in $(( $(date +%s) - t0 )) s (live rc=$rc); leaderboards: $OUT/rl_sim/leaderboard.md $OUT/rl_live/leaderboard.md"
exit $rc
