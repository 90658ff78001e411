#!/usr/bin/env bash
# kvrl-fidelity on env=slo_shift's traffic (docs/fidelity.md, run 36): two tenants with Azure-code lengths
# whose Poisson rates swap every 20 s, TPOT objectives of 2.5 and 10 ms, a 1,024-block pool, one 40 s
# window; the rule slo_mix against the constant 0.2. Run 33 found the sim's p50 TTFT +122% and p50 TPOT
# +11% on the RL task's live runs, which record no step trace; kvrl-fidelity's replay splits the
# error by step kind (decode, mixed, host). The workload and policies are added as Hydra overrides, so
# kvrl-fidelity's default set is unchanged. Output: $OUT/fidelity_slo_shift (kvrl-fidelity's files).
#   bash benchmarks/fidelity_slo_shift.sh [more kvrl-fidelity overrides]
# A CPU smoke test: bash benchmarks/fidelity_slo_shift.sh model=tiny live.device=cpu live.dtype=float32 \
#   max_requests=8 warmup_requests=0 live_repeats=1
set -uo pipefail
OUT=${OUT:-/tmp/kvrl-out}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
. benchmarks/device_env.sh
tenant() {   # name, base rate, rate phases, TPOT objective (s)
  echo "{name:$1,arrival:{process:poisson,rate:$2},rate_phases:$3,phase_s:20.0,slo_ttft_s:${5:-2.0},slo_tpot_s:$4,prompt_len:{dist:empirical,trace:azure_code,field:prompt},output_len:{dist:empirical,trace:azure_code,field:output}}"
}
policy() { echo "{scheduler:{name:fcfs},watermark:$1,eviction:{name:lifo,mode:recompute},prefix_cache:{name:hash_lru}}"; }
WORKLOAD="+workloads.slo_shift_mix={doc:\"env=slo_shift traffic: two tenants (Azure-code lengths) whose Poisson rates swap every 20 s, TPOT objectives 2.5 and 10 ms, 1024-block pool, one 40 s window\",engine:{num_blocks:1024,num_cpu_blocks:4096},workload:{name:multi_tenant,horizon_s:40.0,seed:16,tenants:[$(tenant chat 18.0 '[1.8,0.2]' 0.0025 2.0),$(tenant batch 24.0 '[0.2,1.8]' 0.01 10.0)]}}"
python3 -m kvrl.apps.fidelity "$WORKLOAD" only_workloads=[slo_shift_mix] \
  "+policies.slo_mix=$(policy '{name:slo_mix,tight:0.3,loose:0.0,share:0.3}')" \
  "+policies.fixed_0_2=$(policy '{name:fixed,fraction:0.2}')" only_policies=[slo_mix,fixed_0_2] \
  slo.ttft_s=2.0 slo.tpot_s=0.004 warmup_requests=64 max_live_wall_s=60 plots=false \
  "hydra.run.dir=$OUT/fidelity_slo_shift" "$@"
