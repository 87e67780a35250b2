"""`make vertex-train`: the Vertex AI custom job, read back with the official client's own types
(google.cloud.aiplatform_v1, unknown fields refused), for the TPU types Vertex AI runs TensorFlow on;
one line, and no request, for everything else. `make image`: the commands and the address the jobs
use; the image leaves local data and credentials out. Nothing here reaches the network."""

import argparse
import re
import subprocess
import sys

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import aiplatform_v1

from conftest import PROJECT
from {{ cookiecutter.package }} import launch
from {{ cookiecutter.package }}.core import errors, gcp
from {{ cookiecutter.package }}.core.errors import UserError, run_cli
from {{ cookiecutter.package }}.launch import vertex

CONFIG = "configs/tpu.yaml"
REMOTE = ("data.dir=gs://b/tfrecords", "runtime.output_dir=gs://b/runs/x")
ARGS = ["--config", CONFIG, "--project", "my-project", "--region", "us-west4", "--image_tag", "v7"]
# The template's TPU types; Vertex AI trains TensorFlow on the single-host v5e one.
REFUSED = ("v4-8", "v4-16", "v4-32", "v5litepod-16", "v5p-8", "v6e-8")


@pytest.fixture(autouse=True)
def in_the_project(monkeypatch):
    monkeypatch.chdir(PROJECT)  # config paths are the project's, as in the image


def read_job(text: str) -> aiplatform_v1.CustomJob:
    return aiplatform_v1.CustomJob.from_json(text, ignore_unknown_fields=False)


def dry_run(capsys, *args: str) -> aiplatform_v1.CustomJob:
    assert vertex.main([*ARGS, "--dry_run", *args]) == 0
    return read_job(capsys.readouterr().out)


def refusal(capsys, *args: str) -> str:
    """The one line a refused command prints; it prints no request."""
    with pytest.raises(SystemExit) as exit_info:
        run_cli(vertex.main, [*ARGS, *args])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2 and out == "", out
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_make_vertex_train_dry_run_prints_only_the_request():
    """What the every-target run does: the v5e job from a bake of any TPU type, as JSON on stdout."""
    variables = ["DRY_RUN=1", "TPU_TYPE=v5litepod-8", "GCP_PROJECT=my-project", "REGION=us-west4"]
    paths = ["DATA_DIR=gs://b/tfrecords", "ARGS=runtime.output_dir=gs://b/r"]
    result = subprocess.run(
        ["make", "--no-print-directory", "vertex-train", f"VENV={sys.prefix}", *variables, *paths],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    job = read_job(result.stdout)
    assert re.fullmatch(re.escape(launch.PROJECT) + r"-v5litepod-8-\d{8}-\d{6}", job.display_name)
    (pool,) = job.job_spec.worker_pool_specs
    assert (pool.machine_spec.machine_type, pool.machine_spec.tpu_topology) == ("ct5lp-hightpu-8t", "2x4")
    assert pool.replica_count == 1
    assert pool.container_spec.image_uri == launch.image_uri("my-project", "us-west4", "latest")
    assert list(pool.container_spec.command) == launch.train_command(
        CONFIG, ["data.dir=gs://b/tfrecords", "runtime.output_dir=gs://b/r"]
    )
    assert [(env.name, env.value) for env in pool.container_spec.env] == [("TPU_ACCELERATOR_TYPE", "v5litepod-8")]
    assert job.job_spec.base_output_directory.output_uri_prefix == "gs://b/r"
    assert job.job_spec.scheduling.strategy == aiplatform_v1.Scheduling.Strategy.STANDARD
    assert "POST https://us-west4-aiplatform.googleapis.com/v1/projects/my-project/locations/us-west4/customJobs" in (
        result.stderr
    )


@pytest.mark.parametrize(
    "tpu_type, machine_type, tpu_topology",
    [("v5litepod-1", "ct5lp-hightpu-1t", "1x1"), ("v5litepod-4", "ct5lp-hightpu-4t", "2x2")],
)
def test_each_v5e_vm_has_its_machine_type_and_topology(capsys, tpu_type, machine_type, tpu_topology):
    job = dry_run(capsys, "--tpu_type", tpu_type, *REMOTE)
    (pool,) = job.job_spec.worker_pool_specs
    assert (pool.machine_spec.machine_type, pool.machine_spec.tpu_topology) == (machine_type, tpu_topology)
    assert pool.container_spec.image_uri == launch.image_uri("my-project", "us-west4", "v7")


def test_spot_and_vertex_tensorboard(capsys):
    tensorboard = "projects/my-project/locations/us-west4/tensorboards/7"
    account = "trainer@my-project.iam.gserviceaccount.com"
    options = ["--spot", "--tensorboard", tensorboard, "--service_account", account]
    job = dry_run(capsys, "--tpu_type", "v5litepod-8", *options, *REMOTE)
    assert job.job_spec.scheduling.strategy == aiplatform_v1.Scheduling.Strategy.SPOT
    assert (job.job_spec.tensorboard, job.job_spec.service_account) == (tensorboard, account)


@pytest.mark.parametrize("tpu_type", REFUSED)
def test_tpu_types_without_tensorflow_on_vertex_are_refused_in_one_line(capsys, tpu_type):
    error = refusal(capsys, "--dry_run", "--tpu_type", tpu_type, *REMOTE)
    if tpu_type == "v5litepod-16":
        assert "multi-host slice (4 hosts)" in error and "pod-train TPU_TYPE=v5litepod-16" in error, error
    else:
        assert f"TPU type {tpu_type}: Vertex AI runs TensorFlow on TPU v5e only" in error, error
        assert "TPU_TYPE=v5litepod-8" in error, error


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["runtime.output_dir=gs://b/runs/x"], "data.dir=data/tfrecords is a path on this machine"),
        (["data.dir=gs://b/tfrecords", "runtime.output_dir=runs/x"], "runtime.output_dir=runs/x is a path on this"),
        ([*REMOTE, "runtime.tpu=my-slice"], "runtime.tpu=my-slice names a Pod slice"),
        ([*REMOTE, "train.global_batch_size=1020"], "does not divide across 8 replicas"),
        ([*REMOTE, "--tensorboard", "projects/p/locations/r/tensorboards/1"], "needs the job to run as a service"),
    ],
    ids=["local-data", "local-run", "pod-slice", "batch", "tensorboard-without-account"],
)
def test_a_job_that_could_not_run_is_refused_in_one_line(capsys, overrides, expected):
    assert expected in refusal(capsys, "--dry_run", "--tpu_type", "v5litepod-8", *overrides)


def test_submitting_without_credentials_is_one_line(capsys, monkeypatch, tmp_path):
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_AUTH_TOKEN_FOR_TESTING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))  # no ADC file
    monkeypatch.setattr(errors, "identity", None)
    if gcp.on_google_cloud():
        pytest.skip("on a Google Cloud VM the VM's service account is a credential")
    error = refusal(capsys, "--tpu_type", "v5litepod-8", *REMOTE)
    assert "make vertex-train (Vertex AI in my-project, us-west4) needs Google Cloud credentials" in error, error


def test_a_failed_submission_is_one_line(monkeypatch):
    """The real client, against a closed loopback port instead of the regional endpoint."""
    args = argparse.Namespace(config=CONFIG, overrides=list(REMOTE), tpu_type="v5litepod-8", project="my-project")
    args.__dict__.update(region="us-west4", image_tag="v7", spot=False, tensorboard=None, service_account=None)
    job = vertex.custom_job(args)
    with pytest.raises(UserError) as raised:
        vertex.submit(job, "my-project", "us-west4", endpoint="127.0.0.1:9", credentials=AnonymousCredentials())
    message = str(raised.value)
    assert message.startswith("Vertex AI did not create the job in my-project, us-west4: ") and "\n" not in message


def make_image(*variables: str) -> list[str]:
    result = subprocess.run(
        ["make", "--no-print-directory", "image", "DRY_RUN=1", "GCP_PROJECT=my-project", "REGION=us-west4", *variables],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_make_image_builds_and_pushes_the_address_the_jobs_use():
    image = launch.image_uri("my-project", "us-west4", "v7")
    assert make_image("IMAGE_TAG=v7") == [
        "gcloud auth configure-docker us-west4-docker.pkg.dev --quiet",
        f"docker build --tag {image} .",
        f"docker push {image}",
    ]
    assert make_image("IMAGE_TAG=v7", "TF=2.20")[1] == f"docker build --build-arg TF=2.20 --tag {image} ."
    assert make_image("IMAGE_TAG=v7", "CLOUD_BUILD=1") == [
        f"gcloud builds submit --project=my-project --region=us-west4 --tag={image} ."
    ]


def test_the_image_leaves_out_local_data_and_credentials():
    ignored = set((PROJECT / ".dockerignore").read_text().split())
    secrets = re.search(r"^SECRET_EXCLUDES := (.+)$", (PROJECT / "tpu.mk").read_text(), re.M).group(1).split()
    assert secrets and {f"**/{pattern}" for pattern in secrets} <= ignored
    assert {".git", ".venv", "data", "runs", "logs"} <= ignored
    dockerfile = (PROJECT / "Dockerfile").read_text()
    assert f"WORKDIR {launch.WORKDIR}\n" in dockerfile
    assert 'TPU_VM=1 TF="$TF" bash scripts/setup.sh /opt/venv' in dockerfile
