#!/usr/bin/env bash
# Regenerate every number of README.md and docs/ that comes from the sim, on this tree:
#   1. the sweeps of docs/sweeps.md (scripts/sweeps_docs.sh: docs/figures/sweeps/*, ~10-20 min on 2 cores);
#   2. the committed sim outputs that docs/rl.md's scenario tables and facts read
#      (docs/results/rl_scenario/d5ff5ad/*.txt: scripts/rl_scenario_table.py on the archived profile, ~2 min);
#   3. every generated block and fact span (scripts/docs_tables.py update: README.md and docs/**/*.md,
#      `cheap` and `sim` kinds; a block names its command in its BEGIN marker, a fact span its source
#      in scripts/docs_facts.py, which reads the committed result files).
# Then `git diff` shows what moved. GPU runs are not re-run here: their tables are rendered from the
# committed result files (cheap blocks) or carry their command, device, versions and commit
# (see docs/design.md, "Documented numbers").
#
#   scripts/regen_docs.sh                 # everything
#   SKIP_SWEEPS=1 scripts/regen_docs.sh   # without step 1 (the sweeps' summaries as committed)
#   SKIP_RESULTS=1 scripts/regen_docs.sh  # without step 2 (the scenario outputs as committed)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${SKIP_SWEEPS:-}" ]; then
  scripts/sweeps_docs.sh
fi
if [ -z "${SKIP_RESULTS:-}" ]; then
  archived=backend.profile=archive/h200_qwen3-0.6b_bfloat16_d5ff5ad.json
  out=docs/results/rl_scenario/d5ff5ad
  python scripts/rl_scenario_table.py "$archived" > "$out/watermark.txt.new"
  python scripts/rl_scenario_table.py --task preemption "$archived" > "$out/preemption.txt.new"
  mv "$out/watermark.txt.new" "$out/watermark.txt"
  mv "$out/preemption.txt.new" "$out/preemption.txt"
fi
python scripts/docs_tables.py update
python scripts/docs_tables.py check
