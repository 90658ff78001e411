#!/usr/bin/env bash
# Regenerate every number of README.md and docs/ that comes from the sim, on this tree:
#   1. the sweeps of docs/sweeps.md (scripts/sweeps_docs.sh: docs/figures/sweeps/*, ~10-20 min on 2 cores);
#   2. every generated block (scripts/docs_tables.py update: README.md and docs/**/*.md, `cheap` and `sim`
#      kinds; each block names its command in its BEGIN marker).
# Then `git diff` shows what moved. GPU runs are not re-run here: their tables are rendered from the
# committed result files (cheap blocks) or carry their command, device, versions and commit
# (see docs/design.md, "Documented numbers").
#
#   scripts/regen_docs.sh                 # everything
#   SKIP_SWEEPS=1 scripts/regen_docs.sh   # only the generated blocks (the sweeps' summaries as committed)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${SKIP_SWEEPS:-}" ]; then
  scripts/sweeps_docs.sh
fi
python scripts/docs_tables.py update
python scripts/docs_tables.py check
