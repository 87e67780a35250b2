#!/usr/bin/env bash
# Runs a command in a detached tmux session, appending its output to a log file, so that it keeps
# running when the SSH connection drops.
#
#   bash scripts/tmux_run.sh SESSION LOGFILE -- COMMAND [ARGS...]
#
# Follow it with `tail -F LOGFILE` (`make logs`) or `tmux attach -t SESSION` (detach: Ctrl-b d).
# The log gets a start line (time, host, command) and an end line with the exit status.
# The environment of a tmux session comes from the tmux server, not from this shell: put what the
# command needs into COMMAND itself, e.g. `env TPU_NAME=x make train`.
# DRY_RUN=1 prints the tmux command only.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

usage="usage: $0 SESSION LOGFILE -- COMMAND [ARGS...]"

# Inside the tmux session: run the command, log everything, keep its exit status.
if [ "${1:-}" = --inside ]; then
    [ "$#" -ge 4 ] && [ "$3" = "--" ] || die "$usage"
    log="$2"
    shift 3
    {
        echo "=== $(date -u +%FT%TZ) on $(hostname): $(quote_command "$@")"
        status=0
        "$@" || status=$?
        echo "=== exit status $status"
        exit "$status"
    } 2>&1 | tee -a "$log"
    exit "${PIPESTATUS[0]}"
fi

[ "$#" -ge 4 ] && [ "$3" = "--" ] || die "$usage"
session="$1"
log="$2"
shift 3

if ! dry_run; then
    command -v tmux >/dev/null || die "tmux is not installed (sudo apt-get install -y tmux)"
    if tmux has-session -t "=$session" 2>/dev/null; then
        die "tmux session '$session' is already running: follow it with 'tail -F $log' or" \
            "'tmux attach -t $session'; stop it with 'tmux kill-session -t $session'"
    fi
    mkdir -p "$(dirname "$log")"
fi
run tmux new-session -d -s "$session" -c "$PWD" bash scripts/tmux_run.sh --inside "$log" -- "$@"
if ! dry_run; then
    echo "Started in tmux session '$session'; log: $log (follow: tail -F $log)" >&2
fi
