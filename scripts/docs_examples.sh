#!/usr/bin/env bash
# The documented sweep examples, run as documented, printing kvrl-report's tables (Markdown, no
# paths) for the generated blocks of README.md and docs/sweeps.md (scripts/docs_tables.py).
#
#   scripts/docs_examples.sh readme-sweep     # README's sweep line (8 jobs, seconds each)
#   scripts/docs_examples.sh sweeps-first     # docs/sweeps.md's first example (18 jobs)
#   scripts/docs_examples.sh kv-util          # README's KV utilization table (4 runs of 2,000 requests)
set -euo pipefail
cd "$(dirname "$0")/.."
# Short requests arriving at 400/s into a 160-block cache: memory pressure, so the watermark and
# the eviction rule change what is served (at the default 5 req/s nothing competes for blocks).
PRESSURE=(workload=synthetic workload.arrival.rate=400 workload.prompt_len.low=16 workload.prompt_len.high=96
          workload.output_len.mean=64 engine.num_blocks=160 prefix_cache=none)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

example() {   # example <baseline> <overrides...>: the sweep, then kvrl-report's tables
  local baseline=$1; shift
  python -m kvrl.apps.run -m hydra.sweep.dir="$dir/sweep" progress=false plots=false "$@" > "$dir/log" 2>&1 \
    || { tail -40 "$dir/log" >&2; exit 1; }
  python -m kvrl.apps.report "$dir/sweep" baseline="$baseline" tables=true --metrics goodput_tok_s,ttft_p99_s,preemptions
}

kv_util() {   # README's KV utilization table: the paged allocator against the contiguous baselines
  local contiguous="engine.allocator=contiguous prefix_cache=none engine.max_model_len=8192"
  local rows=("paged|(defaults)|"
    "contiguous, reserve prompt + output exactly (oracle)|\`$contiguous engine.contiguous_reserve=oracle\`|$contiguous engine.contiguous_reserve=oracle"
    "contiguous, reserve rounded to a power of two|\`... engine.contiguous_reserve=pow2\`|$contiguous engine.contiguous_reserve=pow2"
    "contiguous, reserve max_model_len (Orca/FasterTransformer without length knowledge)|\`... engine.contiguous_reserve=max\`|$contiguous engine.contiguous_reserve=max")
  printf '| allocator | overrides | kv_utilization |\n|---|---|---:|\n'
  local i=0 row label shown overrides
  for row in "${rows[@]}"; do
    IFS='|' read -r label shown overrides <<< "$row"
    # shellcheck disable=SC2086  # the overrides are separate words
    python -m kvrl.apps.run hydra.run.dir="$dir/kv$i" progress=false plots=false $overrides > "$dir/log" 2>&1 \
      || { tail -40 "$dir/log" >&2; exit 1; }
    printf '| %s | %s | %s |\n' "$label" "$shown" \
      "$(python -c 'import json, sys; print("%.3f" % json.load(open(sys.argv[1]))["kv_utilization"])' "$dir/kv$i/metrics.json")"
    i=$((i + 1))
  done
}

case ${1:-} in
  kv-util) kv_util ;;
  readme-sweep) example fraction=0.0 "${PRESSURE[@]}" workload.num_requests=200 \
                  watermark.fraction=0.0,0.1 workload.seed=0,1,2,3 ;;
  sweeps-first) example fraction=0.0,eviction=lifo "${PRESSURE[@]}" workload.num_requests=600 \
                  watermark.fraction=0.0,0.05,0.1 eviction=lifo,most_blocks workload.seed=0,1,2 ;;
  *) echo "usage: $0 readme-sweep | sweeps-first | kv-util" >&2; exit 2 ;;
esac
