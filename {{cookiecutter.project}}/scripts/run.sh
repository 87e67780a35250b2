#!/usr/bin/env bash
# Runs one command, echoing it first (on stderr, as "+ command"); with DRY_RUN=1 it only prints
# it, on stdout, quoted so that it can be pasted into a shell. tpu.mk runs its gcloud commands
# through it:  bash scripts/run.sh gcloud compute tpus tpu-vm list --zone=...
set -euo pipefail

# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[ "$#" -ge 1 ] || die "usage: $0 COMMAND [ARGS...]"
run "$@"
