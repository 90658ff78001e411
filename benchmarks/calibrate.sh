#!/usr/bin/env bash
# Sim calibration on one GPU (about 6-7 minutes on an H200 with the default stages): profile the live
# executor for Qwen3-0.6B bf16 (and the Llama-3-8B shape), then kvrl-fidelity (4 workloads x 2
# policies, 3 live runs each, sim vs live) with the fresh Qwen profile. Everything lands under $OUT:
#   $OUT/profiles/<device>_<model>_<dtype>.json   profiles to copy into kvrl/executors/profiles/
#   $OUT/profile_<model>/{profile.json,profile.md} fit report (grid, held-out, engine replay errors)
#   $OUT/fidelity_qwen3-0.6b/{fidelity.md,fidelity.csv,fidelity.json,steps_*.png,runs/...}
#   $OUT/<stage>.log                                every stage's output
# Usage: bash benchmarks/calibrate.sh [STAGE...]   (default: env profile_qwen fidelity_qwen profile_llama summary)
# Expected ~1-2 min per profile and ~4.5 min for fidelity; the stage caps (60+200+560+200 s) add up
# to more than one 10-minute device call, so on a capped machine split it into two calls:
#   bash benchmarks/calibrate.sh env profile_qwen fidelity_qwen    # fidelity needs this call's profile
#   bash benchmarks/calibrate.sh profile_llama summary
# kvrl-fidelity rewrites its tables after every pair, so a stage cut short keeps the pairs it finished.
# Stages: env profile_qwen fidelity_qwen profile_llama fidelity_llama fidelity_pressure residuals host_speed summary
# host_speed (session 20): after fidelity_pressure with a profile that recorded host probes (a fresh one),
#   bash benchmarks/calibrate.sh env profile_qwen fidelity_pressure host_speed
# re-prices its live runs with host_speed=probe -> $OUT/host_speed_$QWEN.md (host-time error with and without).
# Issue 16 (fit version 9, pressure terms fitted by kvrl-profile), one device call (~8 min on an H200):
#   bash benchmarks/calibrate.sh env profile_qwen fidelity_pressure residuals
# fidelity_pressure: the 8 pressured workloads of $PRESSURE_WORKLOADS x 2 policies x 3 live runs with this
# call's fresh profile (none of them is in the profile's fitting data: its grid and short engine runs);
# residuals: the live steps of that run priced by the shipped profile (before) and the fresh one (after),
# per step kind and pair (scripts/fidelity_residuals.py; CPU, seconds) -> $OUT/residuals_$QWEN.{md,csv}.
# Split over two calls: carry the first call's $OUT/profile_$QWEN/profile.json into the tree (e.g. runs/fresh.json)
# and run QWEN_PROFILE=runs/fresh.json bash benchmarks/calibrate.sh fidelity_pressure residuals.
# Needs hydra-core/omegaconf/antlr4 (+ xxhash) as wheels in .whl/ when the image lacks them, like
# benchmarks/gpu_session.sh; matplotlib is optional (without it the PNGs are skipped; re-draw them
# anywhere with: python -c "from kvrl.fidelity.report import replot; replot('$OUT/fidelity_qwen3-0.6b')").
# Knobs (environment): FID_ARGS="..." extra kvrl-fidelity overrides, e.g.
#   FID_ARGS="workloads.poisson.workload.arrival.rate=200 max_requests=300"
# PROF_ARGS="..." extra kvrl-profile overrides; PRESSURE_LIMIT_S (default 420) the fidelity_pressure stage's cap; QWEN=qwen3-0.6b LLAMA=llama-3-8b DTYPE=bfloat16 DEV=auto
# (a CPU smoke test of this script: QWEN=tiny DTYPE=float32 DEV=cpu FID_ARGS="max_requests=8 warmup_requests=0").
set -uo pipefail
OUT=${OUT:-/tmp/kvrl-out}; mkdir -p "$OUT/profiles"
. "$(dirname "$0")/device_env.sh"
run() { local name=$1 limit=$2; shift 2; echo "=== $name ($(date +%T), limit ${limit}s)"; local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  tail -n 30 "$OUT/$name.log"; echo "=== $name rc=$rc in $((SECONDS - t0)) s"; return 0; }
QWEN=${QWEN:-qwen3-0.6b}; LLAMA=${LLAMA:-llama-3-8b}; DTYPE=${DTYPE:-bfloat16}; DEV=${DEV:-auto}
QWEN_PROFILE=${QWEN_PROFILE:-"$OUT/profile_$QWEN/profile.json"}; LLAMA_PROFILE="$OUT/profile_$LLAMA/profile.json"
PRESSURE_WORKLOADS=${PRESSURE_WORKLOADS:-"[poisson,preempt_heavy,code_trace_tight,code_trace_offline,long_outputs_swap,prefix_evict,tenants_pressure,bursty_tight]"}
STAGES=("$@"); [ ${#STAGES[@]} -eq 0 ] && STAGES=(env profile_qwen fidelity_qwen profile_llama summary)
for stage in "${STAGES[@]}"; do
  case $stage in
    env) run env 60 bash -c 'nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv; python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())"; python3 -c "import hydra, omegaconf, xxhash; print(\"hydra\", hydra.__version__)"; python3 -c "import matplotlib; print(\"matplotlib\", matplotlib.__version__)" || echo "no matplotlib: PNGs skipped"' ;;
    profile_qwen) run profile_qwen 200 python3 -m kvrl.apps.profile_app "model=$QWEN" "backend.dtype=$DTYPE" \
        "backend.device=$DEV" "hydra.run.dir=$OUT/profile_$QWEN" "install_dir=$OUT/profiles" ${PROF_ARGS:-} ;;
    fidelity_qwen)
      prof=select; [ -f "$QWEN_PROFILE" ] && prof="$QWEN_PROFILE"
      run fidelity_qwen 560 python3 -m kvrl.apps.fidelity "model=$QWEN" "live.dtype=$DTYPE" "live.device=$DEV" \
        "profile=$prof" "hydra.run.dir=$OUT/fidelity_$QWEN" ${FID_ARGS:-} ;;
    profile_llama) run profile_llama 200 python3 -m kvrl.apps.profile_app "model=$LLAMA" "backend.dtype=$DTYPE" \
        "backend.device=$DEV" "hydra.run.dir=$OUT/profile_$LLAMA" "install_dir=$OUT/profiles" \
        "grid.prefix_cached=[1024,4096]" "grid.holdout=30" ${PROF_ARGS:-} ;;
    fidelity_llama)
      prof=select; [ -f "$LLAMA_PROFILE" ] && prof="$LLAMA_PROFILE"
      run fidelity_llama 400 python3 -m kvrl.apps.fidelity "model=$LLAMA" "live.dtype=$DTYPE" "live.device=$DEV" \
        "profile=$prof" "hydra.run.dir=$OUT/fidelity_$LLAMA" max_requests=200 ${FID_ARGS:-} ;;
    fidelity_pressure)
      prof=select; [ -f "$QWEN_PROFILE" ] && prof="$QWEN_PROFILE"
      echo "=== fidelity_pressure: sim profile $prof"   # select = the matching profile closest on the first live run (no fresh profile in this call)
      run fidelity_pressure "${PRESSURE_LIMIT_S:-420}" python3 -m kvrl.apps.fidelity "model=$QWEN" "live.dtype=$DTYPE" "live.device=$DEV" \
        "profile=$prof" "hydra.run.dir=$OUT/fidelity_pressure_$QWEN" "only_workloads=$PRESSURE_WORKLOADS" \
        warmup_requests=64 max_live_wall_s=40 live_repeats=3 plots=false ${FID_ARGS:-} ;;
    residuals)
      # before: the shipped profile of the fresh one's device and shape (the fresh one itself when none ships, e.g. on CPU)
      shipped=$(python3 -c 'import sys, os; from kvrl.executors.profile import PACKAGED_DIR, StepProfile
from kvrl.profiling.run import install_name
p = PACKAGED_DIR / install_name(StepProfile.load(sys.argv[1])); print(p if p.exists() else sys.argv[1])' "$QWEN_PROFILE")
      run residuals 120 python3 scripts/fidelity_residuals.py --run "$OUT/fidelity_pressure_$QWEN" \
        --before "$shipped" --after "$QWEN_PROFILE" --out "$OUT/residuals_$QWEN" ;;
    host_speed)
      # the fidelity_pressure run re-priced offline with host_speed=probe (kvrl/executors/host_speed.py): the
      # engine's host time at the live host's measured speed, against the profile's host speed (docs/fidelity.md,
      # "Host speed"); CPU only, seconds
      run host_speed 120 bash -c "python3 -m kvrl.apps.fidelity resim='$OUT/fidelity_pressure_$QWEN' \
        profile='$QWEN_PROFILE' host_speed=probe hydra.run.dir='$OUT/fidelity_pressure_${QWEN}_probe' plots=false \
        > /dev/null && python3 scripts/host_speed_table.py \
        'pressure=$OUT/fidelity_pressure_$QWEN:$OUT/fidelity_pressure_${QWEN}_probe' | tee '$OUT/host_speed_$QWEN.md'" ;;
    summary)
      echo "=== summary"; ls -la "$OUT/profiles"
      for f in "$OUT"/profile_*/profile.md "$OUT"/fidelity_*/fidelity.md; do [ -f "$f" ] && { echo; echo "--- $f"; cat "$f"; }; done ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
