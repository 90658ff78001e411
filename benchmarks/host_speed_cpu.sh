#!/usr/bin/env bash
# Does the sim's host_speed=probe follow the engine's host time when the host slows down? (issue 16,
# docs/fidelity.md "Host speed"). CPU only, the tiny model, about 5 minutes on a 2-core machine:
#   1. kvrl-profile of the tiny model on a quiet machine (its engine runs record the host probes);
#   2. kvrl-fidelity (2 workloads x 2 policies, one live run each) on the quiet machine, and again
#      with $LOAD busy Python processes competing for the CPUs;
#   3. both runs re-simulated offline with host_speed=probe;
#   4. scripts/host_speed_table.py: the engine's time between steps, live against the sim's host
#      terms with the profile's host speed (1.0) and with the probe ratio, per pair.
# Usage: bash benchmarks/host_speed_cpu.sh [OUT_DIR]   (LOAD=3 by default; the table goes to stdout
# and OUT_DIR/host_speed.md)
set -euo pipefail
OUT=${1:-runs/host_speed_cpu}; LOAD=${LOAD:-3}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
FID=(model=tiny live.device=cpu "profile=$OUT/profile/profile.json" max_requests=60 warmup_requests=0
     live_repeats=1 plots=false "only_workloads=[poisson,preempt_heavy]")
python -m kvrl.apps.profile_app model=tiny backend.device=cpu "hydra.run.dir=$OUT/profile" \
  "install_dir=$OUT/installed" progress=false > "$OUT/profile.log" 2>&1
python -m kvrl.apps.fidelity "${FID[@]}" "hydra.run.dir=$OUT/quiet" > "$OUT/quiet.log" 2>&1
pids=(); for _ in $(seq "$LOAD"); do python -c "while True: pass" & pids+=($!); done
python -m kvrl.apps.fidelity "${FID[@]}" "hydra.run.dir=$OUT/loaded" > "$OUT/loaded.log" 2>&1 || true
kill "${pids[@]}" 2>/dev/null || true
for run in quiet loaded; do
  python -m kvrl.apps.fidelity "resim=$OUT/$run" "profile=$OUT/profile/profile.json" host_speed=probe \
    "hydra.run.dir=$OUT/${run}_probe" plots=false > "$OUT/${run}_probe.log" 2>&1
done
python scripts/host_speed_table.py --load "$LOAD" "quiet=$OUT/quiet:$OUT/quiet_probe" \
  "loaded=$OUT/loaded:$OUT/loaded_probe" | tee "$OUT/host_speed.md"
