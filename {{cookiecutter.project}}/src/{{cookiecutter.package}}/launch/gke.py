"""`make gke-manifest`: the Kubernetes manifests that train on a single-host TPU slice of a GKE
cluster, printed as YAML documents for `kubectl apply -f -`.

    make gke-manifest ARGS="data.dir=gs://BUCKET/tfrecords runtime.output_dir=gs://BUCKET/runs/x" | kubectl apply -f -
    kubectl logs -f job/{{ cookiecutter.project }}-x       # the training log (Cloud Logging keeps it too)

Two documents: the Kubernetes service account the pod runs as (KSA), and a batch/v1 Job.

* The slice. The pod selects its node by `cloud.google.com/gke-tpu-accelerator` (the generation,
  ACCELERATORS below) and `cloud.google.com/gke-tpu-topology` (topology.slice_topology), and asks for
  all of that host's chips as `google.com/tpu` [1]: GKE Autopilot, or a Standard node pool of that
  shape, gives it the node. The container needs no privileges on GKE 1.28 and later [2].
* The command. The project's image (`make image`) runs launch.train_command in /app, the command
  `make train` runs. CONFIG is read from the image (rebuild it after changing configs/); the
  key=value overrides travel on the command line. data.dir and runtime.output_dir must be gs://.
* The bucket. Workload Identity Federation for GKE makes the service account an IAM principal [3];
  grant it the bucket once (NUMBER is the project's number):
      gcloud storage buckets add-iam-policy-binding gs://BUCKET --role=roles/storage.objectUser \\
        --member=principal://iam.googleapis.com/projects/NUMBER/locations/global/workloadIdentityPools/PROJECT.svc.id.goog/subject/ns/NAMESPACE/sa/KSA
* Preemption. A Spot node (SPOT=1) that Compute Engine reclaims shuts down gracefully: the kubelet
  sends the pod SIGTERM and, on a best-effort basis, gives it 15 s [4]. Host maintenance of a TPU
  node terminates its pods gracefully too, within terminationGracePeriodSeconds [5]. Both reach
  training as SIGTERM, which saves a checkpoint at the next execution boundary and exits with 143
  (core/callbacks.py). The metadata watcher (core/preemption.py) learns nothing here: the GKE
  metadata server in front of the pod serves the token endpoint and a few static values, not
  instance/preempted or instance/maintenance-event [3], so its polls find no notice; SIGTERM is the one.
  The Job's podFailurePolicy [6] sorts the ends: exit status 143 (checkpoint saved) and the
  DisruptionTarget condition (a node shutdown, eviction or preemption that killed the pod before it
  saved [7]) do not count towards backoffLimit, and the replacement resumes from the checkpoints in
  runtime.output_dir; exit status 2 (a one-line error that the same command would repeat) fails the
  Job at once; any other failure counts, BACKOFF_LIMIT of them fail the Job. A replacement starts
  only once the pod before it has ended (podReplacementPolicy: Failed): one run, one writer.
* Multi-host slices (v4-16, v5litepod-16, ...) are refused. TensorFlow needs a TensorFlow server on
  every TPU host and the training client on the first; GKE documents multi-host TPU training for
  JAX and PyTorch only [8], so no recipe here could be validated. They train as a TPU VM Pod slice.

Checked offline only (tests/test_gke.py): every document against the Kubernetes API's schema
(kubernetes-validate, strict) and the official Python client's models; never applied to a cluster.

[1] https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus (labels, topologies, chips);
    the same labels in https://github.com/AI-Hypercomputer/xpk (src/xpk/core/system_characteristics.py)
[2] https://cloud.google.com/kubernetes-engine/docs/concepts/node-auto-provisioning (TPU example)
[3] https://cloud.google.com/kubernetes-engine/docs/concepts/workload-identity,
    https://cloud.google.com/kubernetes-engine/docs/how-to/workload-identity
[4] https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms
[5] https://cloud.google.com/kubernetes-engine/docs/concepts/handle-disruption-gpu-tpu
[6] https://kubernetes.io/docs/tasks/job/pod-failure-policy/
[7] https://kubernetes.io/docs/concepts/workloads/pods/disruptions/#pod-disruption-conditions
[8] https://cloud.google.com/kubernetes-engine/docs/how-to/tpu-multislice
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Sequence

import yaml

from . import PROJECT, WORKDIR, image_path, image_uri, load_config, remote_paths, train_command
from ..core import topology
from ..core.errors import UserError, run_cli

# The node label value of each TPU generation [1].
ACCELERATORS = {
    "v4": "tpu-v4-podslice",
    "v5litepod": "tpu-v5-lite-podslice",
    "v5p": "tpu-v5p-slice",
    "v6e": "tpu-v6e-slice",
}
CONTAINER = "train"
PREEMPTED = 143  # train.PREEMPTED_EXIT_STATUS: the checkpoint is saved, the same command resumes
USER_ERROR = 2  # errors.run_cli: a one-line error, which a retry would repeat
BACKOFF_LIMIT = 3
# Time from SIGTERM to SIGKILL: enough for a slow checkpoint; a Spot node's shutdown gives 15 s anyway [4].
GRACE_SECONDS = 120


def slice_of(tpu_type: str) -> tuple[str, str, int]:
    """(accelerator label, topology label, chips of the one host) of a single-host `tpu_type`."""
    generation = tpu_type.split("-")[0]
    if generation not in ACCELERATORS:
        raise UserError(f"TPU_TYPE={tpu_type}: the GKE manifests cover {', '.join(ACCELERATORS)} slices; pick one")
    try:
        target = topology.topology(tpu_type)
        if target.hosts == 1:
            return ACCELERATORS[generation], topology.slice_topology(tpu_type), target.chips
    except ValueError as error:
        raise UserError(f"{error}; pick a single-host type such as {generation}-8") from None
    raise UserError(
        f"TPU_TYPE={tpu_type} is a multi-host slice ({target.hosts} hosts), which TensorFlow trains with a server "
        "on every host and one client, a recipe GKE does not document: train it on a TPU VM Pod slice (make "
        f"tpu-create TPU_TYPE={tpu_type}, then make pod-train) or pick a single-host type such as {generation}-8"
    )


def job_name(output_dir: str) -> str:
    """One Job per run: the project and the run directory's last part, as a DNS label."""
    run = output_dir.rstrip("/").rsplit("/", 1)[-1]
    return re.sub(r"[^a-z0-9-]+", "-", f"{PROJECT}-{run}".lower()).strip("-")[:63].rstrip("-")


def manifests(
    config_path: str,
    overrides: Sequence[str],
    tpu_type: str,
    image: str,
    service_account: str,
    namespace: str = "default",
    spot: bool = False,
) -> list[dict]:
    """The ServiceAccount and the Job that train `config_path` with `overrides` on a `tpu_type` node."""
    accelerator, grid, chips = slice_of(tpu_type)
    relative = image_path(config_path)
    output_dir = remote_paths(load_config(relative, overrides), "GKE pod")["runtime.output_dir"]
    selector = {"cloud.google.com/gke-tpu-accelerator": accelerator, "cloud.google.com/gke-tpu-topology": grid}
    if spot:
        selector["cloud.google.com/gke-spot"] = "true"
    tpus = {"google.com/tpu": str(chips)}
    container = {
        "name": CONTAINER,
        "image": image,
        "command": train_command(relative, overrides),
        "workingDir": WORKDIR,
        "resources": {"requests": dict(tpus), "limits": dict(tpus)},
    }
    pod = {
        "serviceAccountName": service_account,
        "nodeSelector": selector,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": GRACE_SECONDS,
        "containers": [container],
    }
    rules = [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "Ignore", "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": [PREEMPTED]}},
        {"action": "FailJob", "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": [USER_ERROR]}},
    ]
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job_name(output_dir), "namespace": namespace},
        "spec": {
            "backoffLimit": BACKOFF_LIMIT,
            "podReplacementPolicy": "Failed",
            "podFailurePolicy": {"rules": rules},
            "template": {"spec": pod},
        },
    }
    metadata = {"name": service_account, "namespace": namespace}
    return [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata}, job]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="YAML file under configs/, as the image holds it")
    parser.add_argument("--tpu_type", required=True, help="a single-host TPU type, e.g. v5litepod-8")
    parser.add_argument("--project", required=True, help="the project of the Artifact Registry repository")
    parser.add_argument("--region", required=True, help="the region of the Artifact Registry repository")
    parser.add_argument("--image_tag", default="latest")
    parser.add_argument("--service_account", required=True, help="Kubernetes service account with the bucket")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--spot", action="store_true", help="ask for a Spot node")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value, as for make train")
    args = parser.parse_args(argv)
    docs = manifests(
        args.config,
        args.overrides,
        args.tpu_type,
        image_uri(args.project, args.region, args.image_tag),
        args.service_account,
        args.namespace,
        args.spot,
    )
    job = docs[-1]["metadata"]["name"]
    print(f"# make gke-manifest | kubectl apply -f - ; the log: kubectl logs -f job/{job} -n {args.namespace}")
    print(yaml.safe_dump_all(docs, sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
