#!/usr/bin/env bash
# Starts training on a TPU Pod slice (multi-host). `make pod-train` runs it on every worker at once
# (gcloud compute tpus tpu-vm ssh --worker=all), after scripts/tpu_cleanup.sh --restart-runtime.
#
#   bash scripts/pod_train.sh TPU_NAME [CONFIG] [KEY=VALUE...]
#
# How TensorFlow's TPUStrategy uses a slice: ONE Python process, on worker 0, is the TensorFlow
# client. TPUClusterResolver(tpu=TPU_NAME) asks the Cloud TPU API for the workers' addresses and
# connects to the TensorFlow server that the tpu-runtime service (part of the -pod runtime images)
# runs on port 8470 of every worker, worker 0 included. Those servers own the chips, run the
# compiled steps and the tf.data input pipelines: the client must not open the local chips itself,
# hence TPU_LOAD_LIBRARY=0, and the data must be on gs:// where every worker can read it.
#
#   worker 0:    make train CONFIG=configs/pod.yaml ARGS="runtime.tpu=TPU_NAME ..." with
#                TPU_NAME=TPU_NAME TPU_LOAD_LIBRARY=0, in tmux session "pod-train";
#                its output goes to logs/pod/worker-0.log, the local server's to worker-0-runtime.log
#   worker N>0:  runs no training code; its tpu-runtime journal is copied to logs/pod/worker-N.log
#
# The worker number comes from POD_WORKER if set, else the TPU VM host name (...-w-N), else the
# VM metadata (agent-worker-number). DRY_RUN=1 prints the commands only.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

[ "$#" -ge 1 ] || die "usage: $0 TPU_NAME [CONFIG] [KEY=VALUE...]"
tpu_name="$1"
config="${2:-configs/pod.yaml}"
shift
[ "$#" -ge 1 ] && shift
overrides="runtime.tpu=${tpu_name}${*:+ $*}"

log_dir=logs/pod
train_session=pod-train
runtime_session=tpu-runtime-log

worker_number() {
    local host
    if [ -n "${POD_WORKER:-}" ]; then
        echo "$POD_WORKER"
        return
    fi
    host=$(hostname)
    if [[ "$host" =~ -w-([0-9]+)$ ]]; then
        echo "${BASH_REMATCH[1]}"
        return
    fi
    curl -fsS -H 'Metadata-Flavor: Google' \
        http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number \
        || die "cannot tell which worker this is; set POD_WORKER"
}

follow_runtime_journal() {
    local log="$1"
    if ! dry_run && ! systemctl is-active --quiet tpu-runtime 2>/dev/null; then
        echo "warning: the tpu-runtime service is not running on $(hostname); TensorFlow on a Pod slice" \
            "needs it on every worker: create the slice with a -pod runtime image (RUNTIME_VERSION in tpu.mk)" >&2
    fi
    if ! dry_run; then
        tmux kill-session -t "=$runtime_session" 2>/dev/null || true
    fi
    bash scripts/tmux_run.sh "$runtime_session" "$log" -- \
        "${SUDO[@]}" journalctl -u tpu-runtime --follow --lines=200 --no-pager
}

worker=$(worker_number)
[[ "$worker" =~ ^[0-9]+$ ]] || die "bad worker number '$worker'"

if [ "$worker" = 0 ]; then
    follow_runtime_journal "$log_dir/worker-0-runtime.log"
    bash scripts/tmux_run.sh "$train_session" "$log_dir/worker-0.log" -- \
        env TPU_NAME="$tpu_name" TPU_LOAD_LIBRARY=0 \
        make train CONFIG="$config" ARGS="$overrides"
else
    follow_runtime_journal "$log_dir/worker-${worker}.log"
fi
