#!/usr/bin/env bash
# Reproduce the sweeps of docs/sweeps.md in sim and refresh their figures and tables
# (docs/figures/sweeps/<sweep>/: the PNG and PDF figures, report.md and summary.csv of kvrl-report,
# and commit.txt: the tree (KVRL_COMMIT when it runs outside a git checkout), Python and
# hydra-core they ran with). docs/sweeps.md's tables are then
# rebuilt from those summary.csv files by `python scripts/docs_tables.py update docs/sweeps.md`
# (scripts/regen_docs.sh runs both).
#
#   scripts/sweeps_docs.sh            # all four sweeps, 2 parallel jobs (about 10-20 minutes on 2 cores)
#   JOBS=8 OUT=/scratch/kvrl scripts/sweeps_docs.sh opt_factor
#
# Job folders go to $OUT/<sweep> (default runs/docs); the report to $OUT/<sweep>/report.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/docs}
JOBS=${JOBS:-2}
SEEDS=workload.seed=0,1,2
# Short requests (prompt 16-96 tokens, ~64 output tokens: 2-10 blocks of 16 tokens, the range the
# CPEN 511 parameters were chosen for) arriving at 400/s into a 160-block cache.
PRESSURE=(workload=synthetic workload.num_requests=600 workload.arrival.rate=400 workload.prompt_len.low=16
          workload.prompt_len.high=96 workload.output_len.mean=64 engine.num_blocks=160 prefix_cache=none)
# 16 shared 256-token system prompts (Zipf popularity) in a 256-block cache.
PREFIX=(workload=shared_prefix workload.num_requests=400 workload.num_groups=16 workload.group_skew=1.0
        workload.prefix_len=256 workload.suffix_len.mean=64 workload.output_len.mean=64 workload.arrival.rate=200
        engine.num_blocks=256)

sweep() {   # sweep <name> <baseline> <overrides...>: multirun into $OUT/<name>, report, copy into docs/figures
  local name=$1 baseline=$2; shift 2
  rm -rf "${OUT:?}/$name"
  python -m kvrl.apps.run -m hydra/launcher=joblib hydra.launcher.n_jobs="$JOBS" hydra.sweep.dir="$OUT/$name" \
    progress=false plots=false "$@" > "$OUT/$name.log" 2>&1
  python -m kvrl.apps.report "$OUT/$name" baseline="$baseline" holm=true > "$OUT/$name.report.log"
  mkdir -p "docs/figures/sweeps/$name"
  rm -f "docs/figures/sweeps/$name/"*
  cp "$OUT/$name/report/"{report.md,summary.csv,*.png,*.pdf} "docs/figures/sweeps/$name/"
  # the report names the local sweep directory: keep the committed copy free of machine paths
  sed -i "s|$OUT/$name|$name|g" "docs/figures/sweeps/$name/report.md"
  printf 'commit %s%s\npython %s\nhydra-core %s\ncommand scripts/sweeps_docs.sh %s\n' \
    "${KVRL_COMMIT:-$(git rev-parse --short HEAD)}" \
    "$( [ -n "${KVRL_COMMIT:-}" ] || git diff --quiet HEAD -- kvrl envs conf || echo ' (with uncommitted changes)')" \
    "$(python -c 'import platform; print(platform.python_version())')" \
    "$(python -c 'import hydra; print(hydra.__version__)')" "$name" > "docs/figures/sweeps/$name/commit.txt"
}

names=("$@")
[ ${#names[@]} -gt 0 ] || names=(opt_factor avg_block_len fixed eviction_prefix)
mkdir -p "$OUT"
for name in "${names[@]}"; do
  case $name in
    opt_factor)      sweep opt_factor a=0 "${PRESSURE[@]}" watermark=opt_factor 'watermark.a=range(0,12.5,0.5)' $SEEDS ;;
    avg_block_len)   sweep avg_block_len t=7.4 "${PRESSURE[@]}" watermark=avg_block_len 'watermark.t=range(1.8,7.6,0.4)' $SEEDS ;;
    fixed)           sweep fixed fraction=0.01 "${PRESSURE[@]}" watermark=fixed watermark.fraction=0.0,0.01,0.02,0.05,0.1,0.2 $SEEDS ;;
    eviction_prefix) sweep eviction_prefix eviction=lifo,prefix_cache=hash_lru "${PREFIX[@]}" \
                       eviction=lifo,fewest_computed,most_blocks,cost_aware prefix_cache=none,hash_lru,hash_lfu,radix_lru $SEEDS ;;
    *) echo "unknown sweep $name (opt_factor | avg_block_len | fixed | eviction_prefix)" >&2; exit 2 ;;
  esac
done
