#!/usr/bin/env bash
# Re-run many committed sim leaderboards at once on a many-core host (scripts/rerun_leaderboard.py
# --regenerate, JOBS leaderboards in parallel, WORKERS kvrl-eval workers each), longest first.
#
#   INTO=docs/results/fit11 JOBS=8 WORKERS=4 scripts/regen_leaderboards.sh docs/results/rl_sim_suite/pressure_leaderboard.md ...
#   scripts/regen_leaderboards.sh --verdict      # every sim leaderboard of docs/rl.md's verdict table
#
# INTO (optional): write the regenerated files under INTO/<folder below docs/results>/ instead of over the
# committed ones. PROFILE (optional): the sim's backend.profile for every re-run. OUT_JSONL (default
# runs/regen/regen.jsonl): one JSON line per leaderboard (rerun_leaderboard.py's: verdict, rows, the
# largest goodput difference to the committed file, wall seconds). LIMIT_S (default none): stop every
# re-run still going after that many seconds (a device call's limit); the finished ones stay.
# Longest first: the wall seconds the last re-run of each recorded in docs/results/reproduce/*.jsonl.
set -uo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(( $(nproc) / 4 > 0 ? $(nproc) / 4 : 1 ))}
WORKERS=${WORKERS:-4}
OUT_JSONL=${OUT_JSONL:-runs/regen/regen.jsonl}
mkdir -p "$(dirname "$OUT_JSONL")"
boards=("$@")
if [ "${boards[0]:-}" = "--verdict" ]; then   # the verdict table's sim leaderboards (its BEGIN marker's command)
  mapfile -t boards < <(grep -o 'rl_tables.py verdict [^|]*' docs/rl.md | head -1 | tr ' ' '\n' | grep = \
    | sed 's/^[^=]*=//; s/:.*//; s/leaderboard\.csv$/leaderboard.md/' | grep -v rl_live)
fi
[ ${#boards[@]} -gt 0 ] || { echo "usage: $0 --verdict | LEADERBOARD.md..." >&2; exit 2; }
# order by the last recorded wall time, longest first (unknown ones first: assume long)
mapfile -t boards < <(python3 - "${boards[@]}" <<'PY'
import glob, json, sys
wall = {}
for f in sorted(glob.glob("docs/results/reproduce/*.jsonl")):
    for line in open(f):
        d = json.loads(line)
        if d.get("wall_s"):
            wall[d["leaderboard"]] = d["wall_s"]
for b in sorted(sys.argv[1:], key=lambda b: -wall.get(b, 1e9)):
    print(b)
PY
)
extra=(--regenerate --workers "$WORKERS")
[ -z "${INTO:-}" ] || extra+=(--into "$INTO")
[ -z "${PROFILE:-}" ] || extra+=(--profile "$PROFILE")
echo "regenerating ${#boards[@]} leaderboards, $JOBS at a time x $WORKERS workers: ${extra[*]}"
export EXTRA_ARGS="${extra[*]}"
list=$(mktemp); printf '%s\n' "${boards[@]}" > "$list"
# its own process group, so that LIMIT_S stops every re-run it started, not only xargs
setsid bash -c 'xargs -P "$0" -I{} bash -c "python3 scripts/rerun_leaderboard.py {} $EXTRA_ARGS" < "$1" >> "$2"' \
  "$JOBS" "$list" "$OUT_JSONL" &
pid=$!
deadline=$(( $(date +%s) + ${LIMIT_S:-1000000000} ))
while kill -0 "$pid" 2>/dev/null; do
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "LIMIT_S=$LIMIT_S reached: stopping the re-runs still going"; kill -TERM -- "-$pid" 2>/dev/null; sleep 2
    kill -KILL -- "-$pid" 2>/dev/null; break
  fi
  sleep 2
done
wait "$pid" 2>/dev/null
rm -f "$list"
echo "$(grep -c . "$OUT_JSONL") lines in $OUT_JSONL"
