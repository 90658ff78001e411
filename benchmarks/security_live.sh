#!/usr/bin/env bash
# The #14 prefix-probing attacks live on one GPU (Qwen3-0.6B shape, random bf16 weights, KV pool
# sized from GPU memory): kvrl-attack prefix-probe, tenant scope, one attacker account per probe,
# attackers plain / forge / salt_spoof, each against the default keyed blake2b identity and against
# xxh3 (the pre-#14 hash, where the forger must win). 200 probes at 10/s from t = 5 s, victim
# traffic for 25 s: 6 live runs of ~25 s each, ~3 min of GPU time with the model load.
#
#   bash benchmarks/security_live.sh     # on the GPU machine (carry .whl with hydra/omegaconf if needed)
#
# Stages, each writing under $OUT:
#   1. versions: GPU, driver, python/torch/triton, commit.
#   2. sim:  the same experiment on the sim backend (shipped H200 profile): the reference table.
#   3. live: the experiment on the live executor: $OUT/security_live/prefix_probe.{md,json,png}, probes.csv.
# Environment: MODEL (default qwen3-0.6b), LIVE_LIMIT_S (default 420), EXTRA (overrides for both
# stages), LIVE_EXTRA (live stage only). CPU smoke test with the tiny model:
#   MODEL=tiny EXTRA="attack.prefix_probe.workload.num_probes=16 attack.resamples=200" \
#     LIVE_EXTRA="backend.device=cpu engine.num_blocks=512" bash benchmarks/security_live.sh
set -uo pipefail
OUT=${OUT:-/tmp/kvrl-out}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
. benchmarks/device_env.sh
MODEL=${MODEL:-qwen3-0.6b}
LIVE_LIMIT_S=${LIVE_LIMIT_S:-420}
COMMON=("attack.scopes=[tenant]" "attack.probers=[plain,forge,salt_spoof]" "attack.prefix_hashes=[blake2b,xxh3]"
        attack.prefix_probe.workload.num_probes=200 attack.prefix_probe.workload.probe_rate=10.0
        attack.prefix_probe.workload.horizon_s=25.0 workload.attack_start_s=5.0 ${EXTRA:-})
t0=$(date +%s)

echo "=== versions ($(date -u +%FT%TZ))"
device_versions || exit 1

echo "=== sim ($(date +%T))"
timeout 300 python3 -m kvrl.apps.attack prefix-probe backend=sim model=qwen3-0.6b "${COMMON[@]}" \
  "hydra.run.dir=$OUT/security_sim" > "$OUT/security_sim.log" 2>&1
rc=$?; tail -n 14 "$OUT/security_sim.log"; [ $rc -eq 0 ] || { echo "sim stage failed (rc=$rc)"; exit $rc; }

echo "=== live ($(date +%T))"
timeout "$LIVE_LIMIT_S" python3 -m kvrl.apps.attack prefix-probe backend=live "model=$MODEL" "${COMMON[@]}" \
  ${LIVE_EXTRA:-} "hydra.run.dir=$OUT/security_live" > "$OUT/security_live.log" 2>&1
rc=$?; tail -n 14 "$OUT/security_live.log"
echo "=== done in $(( $(date +%s) - t0 )) s (live rc=$rc); tables: $OUT/security_sim/prefix_probe.md $OUT/security_live/prefix_probe.md"
exit $rc
