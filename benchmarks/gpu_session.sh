#!/usr/bin/env bash
# One device call over a copy of the repo: make kvrl importable without pip, then run the named
# stages, writing each stage's log and table under $OUT. Usage: bash benchmarks/gpu_session.sh STAGE...
# Stages: env kernels sweep exactness exactness_step bench_kvrl bench_kvrl_step step_ab step_ab_llama bench_hf bench_all
#         shared_degree step_path exactness32_step split_ab
set -uo pipefail
OUT=${OUT:-/tmp/kvrl-out}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
failed=()   # stages that exited non-zero (an exactness stage exits 1 on a divergence past a tie): named at the end
run() {
  local name=$1 limit=$2; shift 2; echo "=== $name ($(date +%T))"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log" | tail -n 40
  local rc=${PIPESTATUS[0]}; [ "$rc" = 0 ] || { echo "=== $name exited $rc"; failed+=("$name"); }
}
for stage in "$@"; do
  case $stage in
    env) run env 60 bash -c 'nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv; python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())"' ;;
    kernels) run kernels 300 python3 benchmarks/bench_kernels.py --out "$OUT/kernels.md" ;;
    profile) run profile 500 python3 -m kvrl.apps.bench "systems=[kvrl]" profile=true "hydra.run.dir=$OUT/profile" ;;
    trace) run trace 500 python3 -m kvrl.apps.bench "systems=[kvrl]" trace_steps=20 "hydra.run.dir=$OUT/trace" ;;
    fused) run fused 200 python3 benchmarks/bench_fused.py --tokens 256 --out "$OUT/fused.md" ;;
    decode_mix) run decode_mix 200 python3 benchmarks/decode_mix.py ;;
    sweep) run sweep 400 python3 benchmarks/bench_kernels.py --sweep --out "$OUT/kernels_sweep.md" ;;
    exactness) run exactness 500 python3 benchmarks/gpu_exactness.py --out "$OUT/exactness.md" ;;
    exactness_step) run exactness_step 500 python3 benchmarks/gpu_exactness.py --step-graphs --out "$OUT/exactness_step.md" ;;
    exactness32) run exactness32 500 python3 benchmarks/gpu_exactness.py --dtype float32 --out "$OUT/exactness_fp32.md" ;;
    exactness32_step) run exactness32_step 500 python3 benchmarks/gpu_exactness.py --dtype float32 --step-graphs --out "$OUT/exactness_fp32_step.md" ;;
    bench_kvrl) run bench_kvrl 500 python3 -m kvrl.apps.bench "systems=[kvrl]" "hydra.run.dir=$OUT/bench_kvrl" ;;
    bench_kvrl_step) run bench_kvrl_step 500 python3 -m kvrl.apps.bench "systems=[kvrl]" step_graphs=true "hydra.run.dir=$OUT/bench_kvrl_step" ;;
    step_ab) run step_ab 400 python3 benchmarks/step_graph_ab.py --model qwen3-0.6b --out "$OUT/step_ab_qwen.md" ;;
    step_ab_llama) run step_ab_llama 400 python3 benchmarks/step_graph_ab.py --model llama-3-8b --out "$OUT/step_ab_llama.md" ;;
    bench_hf) run bench_hf 580 python3 -m kvrl.apps.bench "systems=[hf_cb,hf_static]" "hydra.run.dir=$OUT/bench_hf" ;;
    step_path) run step_path 300 python3 benchmarks/step_path_probe.py --out "$OUT/step_path.json" ;;
    step_path_below) run step_path_below 300 python3 benchmarks/step_path_probe.py --long 512,1024,2048,3584,4608 --decodes 4,16,64 --out "$OUT/step_path_below.json" ;;
    split_ab) run split_ab "${SPLIT_AB_LIMIT:-420}" python3 benchmarks/split_graph_ab.py --rounds "${ROUNDS:-3}" --out "$OUT/split_ab.json" ;;
    shared_degree) run shared_degree 300 python3 benchmarks/shared_degree_probe.py --out "$OUT/shared_degree.json" ;;
    bench_all) run bench_all 580 python3 -m kvrl.apps.bench "hydra.run.dir=$OUT/bench_all" ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
[ ${#failed[@]} = 0 ] || { echo "=== failed stages: ${failed[*]}"; exit 1; }
