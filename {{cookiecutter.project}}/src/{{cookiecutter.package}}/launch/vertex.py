"""`make vertex-train`: training as a Vertex AI custom job on one TPU v5e VM, in the project's image.

    python -m {{ cookiecutter.package }}.launch.vertex --config configs/tpu.yaml --tpu_type v5litepod-8 \\
        --project PROJECT --region REGION [--image_tag latest] [--spot] [--tensorboard NAME --service_account EMAIL] \\
        [--dry_run] [dotted.key=value ...]

The job is one `CustomJob` of the official client (google.cloud.aiplatform_v1): one worker pool of
one replica, its machine type and `tpu_topology` those of the TPU type, the container the image of
`make image` running `python -m {{ cookiecutter.package }}.train --config FILE key=value ...` (the entry point
of `make train`), and `base_output_directory` the config's runtime.output_dir. --dry_run prints
that request as JSON on stdout (the REST body of projects.locations.customJobs.create) and contacts
nothing; without it the job is submitted, and its name and how to follow it are printed on stderr.

Which TPUs (Vertex AI offers TPU v2, v3 and v5e VMs for training, and TensorFlow 2.15+ on v5e through a
custom container holding the TPU-VM build of tensorflow and libtpu.so in /lib; there is no TensorFlow on
v6e: https://cloud.google.com/vertex-ai/docs/training/training-with-tpu-vm):
  * v5litepod-1, -4 and -8 run: machine types ct5lp-hightpu-1t, -4t, -8t
    (https://cloud.google.com/vertex-ai/docs/training/configure-compute#machine-types) with topologies
    1x1, 2x2, 2x4: MachineSpec.tpu_topology takes GKE's topologies, and GKE gives these machine types
    these topologies (https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus).
  * Multi-host v5e (v5litepod-16 and up) is refused: the TensorFlow section documents a single VM's
    container only, and TPUStrategy across hosts needs a TensorFlow server on every worker (the
    tpu-runtime service of a TPU VM Pod slice, scripts/pod_train.sh), which nothing there runs.
    Vertex AI's Spot VMs do not support TPU Pods either
    (https://cloud.google.com/vertex-ai/docs/training/use-spot-vms). `make pod-train` trains them.
  * Every other type (v4, v5p and v6e among this template's) is refused: a TPU VM (`make tpu-create`)
    or GKE (`make gke-manifest`) runs them.

Preemption, restarts and resuming:
  * --spot (`SPOT=1`) sets scheduling.strategy=SPOT: Spot capacity, which Compute Engine may reclaim at
    any time (use-spot-vms above); STANDARD otherwise. Compute Engine announces a preemption with an ACPI
    soft-off about 30 s ahead (https://cloud.google.com/compute/docs/instances/spot#preemption-process),
    which the VM's shutdown passes on to its processes as SIGTERM (Vertex AI's pages say nothing more
    specific about containers). On SIGTERM training saves a checkpoint and exits with status 143
    (core/callbacks.py).
  * Vertex AI restarts a worker that exits with a non-zero status on the same VM (up to five times, then
    it retries the whole job up to three times), and a worker whose VM goes into maintenance on another
    VM (https://cloud.google.com/vertex-ai/docs/training/understanding-training-service).
    `restart_job_on_worker_restart` concerns jobs of several workers and stays unset: this job has one.
  * A restarted worker runs the same command, and training resumes from the latest checkpoint in
    runtime.output_dir, a gs:// path that outlives the VM; so does a job submitted again with the same
    runtime.output_dir after Vertex AI gave up. scheduling.timeout is Vertex AI's default, 7 days.

Logs go to Cloud Logging (`gcloud ai custom-jobs stream-logs`). TensorBoard's logs are in
runtime.output_dir/logs, which is where Vertex AI points AIP_TENSORBOARD_LOG_DIR for this
base_output_directory: `make tensorboard RUN_DIR=gs://...` reads them from anywhere, and --tensorboard
(`VERTEX_TENSORBOARD=projects/P/locations/R/tensorboards/ID`) streams them to Vertex AI TensorBoard,
which needs a service account of the job (https://cloud.google.com/vertex-ai/docs/experiments/tensorboard-setup).

The image holds the project as it was when `make image` built it: the config file and the code are
that image's; key=value overrides travel in the command. TPU_ACCELERATOR_TYPE is set to the TPU type
(as on a TPU VM and in GKE), so that the training's chip facts (HBM, peak FLOP/s) are the job's.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

from ..core import gcp, topology
from ..core.errors import UserError, run_cli
from . import PROJECT, image_uri, load_config, remote_paths, train_command

# The TPU types a Vertex AI job trains this project on, and their machine types (module docstring).
MACHINE_TYPES = {f"v5litepod-{chips}": f"ct5lp-hightpu-{chips}t" for chips in (1, 4, 8)}
WHERE = "Vertex AI job"


def machine(tpu_type: str) -> tuple[str, str]:
    """(machine type, TPU topology) of `tpu_type`, e.g. ('ct5lp-hightpu-8t', '2x4'); a UserError in one
    line for a TPU type on which Vertex AI does not run this project's TensorFlow."""
    try:
        target = topology.topology(tpu_type)
    except ValueError as error:
        raise UserError(str(error)) from None
    if tpu_type.startswith("v5litepod-") and target.hosts > 1:
        raise UserError(
            f"TPU type {tpu_type} is a multi-host slice ({target.hosts} hosts) and Vertex AI runs TensorFlow on one "
            f"TPU VM only: train it on a TPU VM Pod slice (make tpu-create tpu-copy tpu-setup pod-train "
            f"TPU_TYPE={tpu_type}), or pass TPU_TYPE=v5litepod-8"
        )
    if tpu_type not in MACHINE_TYPES:
        raise UserError(
            f"TPU type {tpu_type}: Vertex AI runs TensorFlow on TPU v5e only ({', '.join(MACHINE_TYPES)}): pass "
            f"TPU_TYPE=v5litepod-8, or train on {tpu_type} on a TPU VM (make tpu-create) or GKE (make gke-manifest)"
        )
    return MACHINE_TYPES[tpu_type], topology.slice_topology(tpu_type)


def _vertex():
    """The Vertex AI client library, imported when needed (a dev dependency: make setup installs it)."""
    try:
        from google.cloud import aiplatform_v1
    except ImportError:
        raise UserError(
            "google-cloud-aiplatform is not installed: run make setup (it installs requirements-dev.txt)"
        ) from None
    return aiplatform_v1


def custom_job(args: argparse.Namespace):
    """The CustomJob that trains `args.config` with `args.overrides` on `args.tpu_type`."""
    machine_type, tpu_topology = machine(args.tpu_type)
    config = load_config(args.config, args.overrides)
    if config.runtime.tpu not in ("local", ""):
        raise UserError(
            f"runtime.tpu={config.runtime.tpu} names a Pod slice, but a {WHERE} trains on its own VM's chips: "
            "pass runtime.tpu=local (configs/tpu.yaml has it)"
        )
    paths = remote_paths(config, WHERE)
    topology.topology(args.tpu_type).per_replica_batch_size(config.train.global_batch_size)
    if args.tensorboard and not args.service_account:
        raise UserError(
            "Vertex AI TensorBoard needs the job to run as a service account: pass VERTEX_SERVICE_ACCOUNT=NAME@"
            f"{args.project}.iam.gserviceaccount.com (roles/storage.admin and roles/aiplatform.user)"
        )
    vertex = _vertex()
    container = vertex.ContainerSpec(
        image_uri=image_uri(args.project, args.region, args.image_tag),
        command=train_command(args.config, args.overrides),
        env=[vertex.EnvVar(name="TPU_ACCELERATOR_TYPE", value=args.tpu_type)],
    )
    pool = vertex.WorkerPoolSpec(
        machine_spec=vertex.MachineSpec(machine_type=machine_type, tpu_topology=tpu_topology),
        replica_count=1,
        container_spec=container,
    )
    strategy = vertex.Scheduling.Strategy.SPOT if args.spot else vertex.Scheduling.Strategy.STANDARD
    spec = vertex.CustomJobSpec(
        worker_pool_specs=[pool],
        scheduling=vertex.Scheduling(strategy=strategy),
        base_output_directory=vertex.GcsDestination(output_uri_prefix=paths["runtime.output_dir"]),
        tensorboard=args.tensorboard or "",
        service_account=args.service_account or "",
    )
    name = f"{PROJECT}-{args.tpu_type}-{time.strftime('%Y%m%d-%H%M%S')}"
    return vertex.CustomJob(display_name=name, job_spec=spec)


def submit(job, project: str, region: str, endpoint: str | None = None, credentials=None):
    """Creates `job` in `region` of `project` through the regional endpoint; returns the created job
    (its name holds its id). Application Default Credentials unless `credentials` are given."""
    if credentials is None:
        gcp.require_credentials({}, service=f"make vertex-train (Vertex AI in {project}, {region})")
    vertex = _vertex()
    from google.api_core import exceptions

    client = vertex.JobServiceClient(
        credentials=credentials, client_options={"api_endpoint": endpoint or f"{region}-aiplatform.googleapis.com"}
    )
    try:
        return client.create_custom_job(parent=f"projects/{project}/locations/{region}", custom_job=job)
    except exceptions.GoogleAPICallError as error:
        detail = (str(error.message).strip().splitlines() or [type(error).__name__])[0][:300]
        raise UserError(f"Vertex AI did not create the job in {project}, {region}: {detail}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="YAML file under configs/ (the image's copy is used)")
    parser.add_argument("--tpu_type", default=topology.DEFAULT_TPU_TYPE, help="e.g. v5litepod-8 (make: TPU_TYPE)")
    parser.add_argument("--project", required=True, help="Google Cloud project of the job and the image")
    parser.add_argument("--region", required=True, help="Vertex AI region, e.g. us-west4; the image's region too")
    parser.add_argument("--image_tag", default="latest", help="tag of the image `make image` pushed")
    parser.add_argument("--spot", action="store_true", help="Spot capacity (scheduling.strategy=SPOT)")
    parser.add_argument("--tensorboard", help="a Vertex AI TensorBoard: projects/P/locations/R/tensorboards/ID")
    parser.add_argument("--service_account", help="the service account the job runs as")
    parser.add_argument("--dry_run", action="store_true", help="print the request as JSON; contact nothing")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value, e.g. data.dir=gs://BUCKET/tfrecords")
    args = parser.parse_args(argv)
    job = custom_job(args)
    endpoint = f"https://{args.region}-aiplatform.googleapis.com/v1/projects/{args.project}/locations/{args.region}"
    if args.dry_run:
        print(type(job).to_json(job, use_integers_for_enums=False, always_print_fields_with_no_presence=False))
        print(f"# the body of POST {endpoint}/customJobs; the image must exist (make image)", file=sys.stderr)
        return 0
    created = submit(job, args.project, args.region)
    job_id = created.name.rsplit("/", 1)[-1]
    print(f"Submitted {created.name} ({created.display_name}).", file=sys.stderr)
    where = f"--project={args.project} --region={args.region}"
    print(f"Logs: gcloud ai custom-jobs stream-logs {job_id} {where}", file=sys.stderr)
    print(f"State: gcloud ai custom-jobs describe {job_id} {where}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
