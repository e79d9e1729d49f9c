#!/usr/bin/env bash
# The documented halt check (spec notes §3, `halt-check.sh`) in plain bash + jq: the yardstick that
# bench/halt_vs_jq.py runs side by side with evolve's Step 1. Written from the spec, not copied.
#
#   bench/halt_check.sh [--json]     (run from the repository root)
#
# Exit 0 = continue, 1 = halt. Output: "HALT: <reason>" / "OK: continue", or with --json
# {"halt":bool,"halt_reason":str|null}. Checks, first match wins:
#   1. a fresh global KILL ($XDG_CONFIG_HOME/evolve/KILL), or a fresh $EVOLVE_DIR/KILL (spec §8.14) -> kill
#   2. a fresh STOP -> user_halt                (stale = floor(age/86400) > TTL days: "STALE" on stderr)
#   3. DORMANT: ready beads (bd ready --json | jq length; 0 on error) or next-work.jsonl lines with
#      consumed == false -> remove DORMANT and go on; none -> dormant
#   4. HANDOFF is removed (never halts)
#   5. governor ($EVOLVE_GOVERNOR_CMD): exit 3 -> governor_budget_burned; other non-zero: fail open
#   6. no readable ledger -> continue
#   7. the last two integer goals_passing values in the ledger: a drop -> goal_regression
#   8. the last non-null result contains FAIL or BLOCKED -> prior_cycle_fail
set -u

EVOLVE_DIR=${EVOLVE_DIR:-.agents/evolve}
EVOLVE_NEXTWORK=${EVOLVE_NEXTWORK:-.agents/rpi/next-work.jsonl}
TTL_DAYS=${EVOLVE_KILL_TTL_DAYS:-7}
TIMEOUT=${EVOLVE_HALT_TIMEOUT:-30}
GOVERNOR=${EVOLVE_GOVERNOR_CMD:-}
LEDGER="$EVOLVE_DIR/cycle-history.jsonl"
GLOBAL_KILL="${XDG_CONFIG_HOME:-$HOME/.config}/evolve/KILL"
JSON=0
[ "${1:-}" = "--json" ] && JSON=1
now=$(date +%s)

finish() {
    if [ -n "$1" ]; then
        if [ "$JSON" = 1 ]; then printf '{"halt":true,"halt_reason":"%s"}\n' "$1"; else echo "HALT: $1"; fi
        exit 1
    fi
    if [ "$JSON" = 1 ]; then echo '{"halt":false,"halt_reason":null}'; else echo "OK: continue"; fi
    exit 0
}

fresh() {
    [ -e "$1" ] || return 1
    local age_days=$(( (now - $(stat -c %Y "$1")) / 86400 ))
    if [ "$age_days" -gt "$TTL_DAYS" ]; then
        echo "STALE: $1 is $age_days days old (TTL $TTL_DAYS days); not honoured, not deleted" >&2
        return 1
    fi
    return 0
}

fresh "$GLOBAL_KILL" && finish kill
fresh "$EVOLVE_DIR/KILL" && finish kill
fresh "$EVOLVE_DIR/STOP" && finish user_halt

if [ -e "$EVOLVE_DIR/DORMANT" ]; then
    ready=0
    if command -v bd >/dev/null 2>&1; then
        ready=$(timeout "$TIMEOUT" bd ready --json 2>/dev/null | jq 'length' 2>/dev/null) || ready=0
    fi
    harvested=0
    if [ -f "$EVOLVE_NEXTWORK" ]; then
        harvested=$(jq -c 'select(.consumed == false)' "$EVOLVE_NEXTWORK" 2>/dev/null | wc -l)
    fi
    if [ "${ready:-0}" -gt 0 ] || [ "$harvested" -gt 0 ]; then
        rm -f "$EVOLVE_DIR/DORMANT"
    else
        finish dormant
    fi
fi

rm -f "$EVOLVE_DIR/HANDOFF"

if [ -n "$GOVERNOR" ]; then
    # shellcheck disable=SC2086  # a command line, split on purpose
    timeout "$TIMEOUT" $GOVERNOR >/dev/null 2>&1
    rc=$?
    if [ "$rc" -eq 3 ]; then
        finish governor_budget_burned
    elif [ "$rc" -ne 0 ]; then
        echo "governor exited $rc; failing open" >&2
    fi
fi

[ -r "$LEDGER" ] || finish ""

# One jq pass over the whole ledger: every integer goals_passing ("g N") and every non-null result
# ("r TEXT"); awk keeps the last two of the first and the last of the second.
read -r prev last result < <(
    jq -r '(if (.goals_passing | type) == "number" and (.goals_passing | floor) == .goals_passing
            then "g \(.goals_passing)" else empty end),
           (if .result != null then "r \(.result)" else empty end)' "$LEDGER" 2>/dev/null |
    awk '$1 == "g" { p = l; l = $2 } $1 == "r" { r = substr($0, 3) }
         END { print (p == "" ? "-" : p), (l == "" ? "-" : l), (r == "" ? "-" : r) }'
)

if [ "$prev" != "-" ] && [ "$last" -lt "$prev" ]; then
    finish goal_regression
fi
case "$result" in
    *FAIL* | *BLOCKED*) finish prior_cycle_fail ;;
esac
finish ""
