#!/usr/bin/env bash
# Runs one command, echoing it first (on stderr, as "+ command"); with DRY_RUN=1 it only prints
# it, on stdout, quoted so that it can be pasted into a shell. tpu.mk runs its gcloud commands
# through it:  bash scripts/run.sh gcloud compute tpus tpu-vm list --zone=...
# Before a gcloud command that runs for real it checks, locally, that gcloud has an account, so
# that a missing login is one line with the fix rather than gcloud's own prompt or traceback.
set -euo pipefail

# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[ "$#" -ge 1 ] || die "usage: $0 COMMAND [ARGS...]"
if ! dry_run && [ "$(basename "$1")" = gcloud ]; then
    require_gcloud_login "$1"
fi
run "$@"
