#!/bin/bash
# Digest of what a set of kvrl-run sim jobs produce, for checking that an engine change leaves every
# result bit-for-bit unchanged: sha256 of metrics.json without its wall-clock keys (policy_time_s,
# wall_s, host gaps) and of requests.csv + steps.csv, per job. Jobs: the default run, the whole Azure
# code trace, and six small runs that preempt (recompute and swap), fork (n > 1), hit the prefix
# cache (hash_lru, hash_lfu with xxh3, radix_lru) and use the CPU tier.
#
#   bash scripts/sim_digest.sh [TREE] > new.txt    # TREE: a kvrl checkout (default: this one)
#   diff <(bash scripts/sim_digest.sh /path/to/old/checkout) new.txt && echo IDENTICAL
#
# An older checkout needs kernels/, envs/ and conf/ linked under its kvrl/ (as benchmarks/device_env.sh does).
set -euo pipefail
tree=$(cd "${1:-$(dirname "$0")/..}" && pwd)
out=$(mktemp -d)
i=0
while IFS= read -r overrides; do
  i=$((i + 1))
  # shellcheck disable=SC2086  # the overrides are words
  (cd "$out" && PYTHONPATH="$tree" python -m kvrl.apps.run $overrides hydra.run.dir="$out/$i" >/dev/null 2>&1) \
    || { echo "job $i failed: $overrides" >&2; exit 1; }
  metrics=$(python -c "
import json, sys
m = json.load(open(sys.argv[1]))
for k in ('policy_time_s', 'wall_s', 'host_gap_s', 'long_host_gaps', 'uncounted_host_gap_s'):
    m.pop(k, None)
print(json.dumps(m, sort_keys=True))" "$out/$i/metrics.json" | sha256sum | cut -c1-16)
  tables=$(cat "$out/$i/requests.csv" "$out/$i/steps.csv" | sha256sum | cut -c1-16)
  echo "$i metrics=$metrics csv=$tables [$overrides]"
done <<'JOBS'
seed=0
workload=azure_code workload.max_requests=null
workload=synthetic workload.num_requests=3000 workload.arrival.process=offline engine.num_blocks=3000
workload=synthetic workload.num_requests=800 workload.parallel_n=3 workload.parallel_prob=0.5 workload.arrival.process=offline engine.num_blocks=1500 eviction=most_blocks eviction.mode=swap
workload=shared_prefix workload.num_requests=800 workload.arrival.rate=100 engine.num_blocks=700 prefix_cache=radix_lru eviction=cost_aware
workload=multi_tenant engine.num_blocks=2000 prefix_cache=hash_lfu engine.prefix_hash=xxh3
workload=synthetic workload.num_requests=600 workload.arrival.process=offline engine.num_blocks=800 engine.cpu_tier_blocks=2000 eviction.mode=swap
workload=shared_prefix workload.num_requests=600 workload.arrival.rate=100 engine.num_blocks=900 workload.parallel_n=2 eviction=lifo
JOBS
rm -rf "$out"
