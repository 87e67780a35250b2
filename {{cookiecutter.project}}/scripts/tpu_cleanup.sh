#!/usr/bin/env bash
# Frees the TPU chips of this TPU VM (one worker of a slice): a crashed or interrupted run can
# leave a process holding the chips, or libtpu's lock file behind, and the next run then fails
# with "TPU in use" / "Unable to initialize backend 'tpu'" / "The TPU is already in use".
#
#   bash scripts/tpu_cleanup.sh                    # `make tpu-cleanup`, single TPU VM
#   bash scripts/tpu_cleanup.sh --restart-runtime  # `make pod-train` runs this on every worker
#
# It kills every process that holds a TPU device file (/dev/accel* on v2-v4, /dev/vfio/<n> on
# v5e, v5p, v6e) and removes /tmp/libtpu_lockfile. On a Pod slice the chips of every worker are
# held on purpose by the tpu-runtime service (the TensorFlow server of the -pod runtime images):
# --restart-runtime stops that service first and starts it again afterwards, so every worker
# serves a fresh TPU system to the next run. DRY_RUN=1 prints the commands only.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

restart_runtime=0
case "${1:-}" in
    --restart-runtime) restart_runtime=1 ;;
    "") ;;
    *) die "usage: $0 [--restart-runtime]" ;;
esac

lockfile=/tmp/libtpu_lockfile
runtime_unit=tpu-runtime.service
runtime_port=8470

has_runtime_unit() {
    command -v systemctl >/dev/null && systemctl cat "$runtime_unit" >/dev/null 2>&1
}

device_holders() {
    local devices=()
    shopt -s nullglob
    devices=(/dev/accel[0-9]* /dev/vfio/[0-9]*)
    shopt -u nullglob
    [ "${devices[*]:-}" ] || return 0
    if command -v lsof >/dev/null; then
        "${SUDO[@]}" lsof -t "${devices[@]}" 2>/dev/null || true
    elif command -v fuser >/dev/null; then
        "${SUDO[@]}" fuser "${devices[@]}" 2>/dev/null | tr -s ' ' '\n' || true
    else
        echo "warning: neither lsof nor fuser is installed; cannot look for processes holding the TPU" >&2
    fi
}

if [ "$restart_runtime" = 1 ] && has_runtime_unit; then
    run "${SUDO[@]}" systemctl stop "$runtime_unit"
fi

pids=$(device_holders | grep -E '^[0-9]+$' | grep -v -x -e "$$" -e "$PPID" | sort -u || true)
for pid in $pids; do
    echo "killing process $pid, which holds a TPU device: $(ps -o args= -p "$pid" 2>/dev/null || true)" >&2
    run "${SUDO[@]}" kill -9 "$pid"
done

run "${SUDO[@]}" rm -f "$lockfile"

if [ "$restart_runtime" = 1 ]; then
    if has_runtime_unit; then
        run "${SUDO[@]}" systemctl start "$runtime_unit"
        if ! dry_run; then
            # The TensorFlow server listens on 8470 once it has opened the chips.
            for _ in $(seq 60); do
                if ss -ltn 2>/dev/null | grep -q ":${runtime_port} "; then
                    echo "tpu-runtime is serving on port ${runtime_port}" >&2
                    exit 0
                fi
                sleep 2
            done
            echo "warning: tpu-runtime is not listening on port ${runtime_port} yet; see: sudo journalctl -u tpu-runtime" >&2
        fi
    else
        echo "warning: no tpu-runtime service on $(hostname): the slice was not created with a -pod runtime image (see RUNTIME_VERSION in tpu.mk)" >&2
    fi
fi
