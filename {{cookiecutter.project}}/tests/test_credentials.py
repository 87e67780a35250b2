"""Without Google Cloud credentials, every command that needs them stops at once with one line
that names what needed them and the fix; a 403 from Cloud Storage names the bucket and the
identity. The local GCS emulator (STORAGE_EMULATOR_HOST) needs none: the gs:// tests elsewhere run
through it unchanged."""

import os
import re
import subprocess
import sys
import time

import pytest
import tensorflow as tf
from google.api_core import exceptions as api_exceptions

from conftest import PROJECT
from {{ cookiecutter.package }} import doctor, evaluate, predict, preprocess, train
from {{ cookiecutter.package }}.core import errors, gcp
from {{ cookiecutter.package }}.core.errors import UserError, run_cli

BUCKET = "gs://my-tpu-bucket"
LOCAL = str(PROJECT / "configs/local.yaml")
# What a machine that never ran `gcloud auth application-default login` has: no ADC file, no key
# file, no emulator (the GCE metadata variables stay on conftest's closed loopback port).
CLEARED = (
    "STORAGE_EMULATOR_HOST",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_AUTH_TOKEN_FOR_TESTING",
    "ON_GOOGLE_CLOUD",
)


@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    for name in CLEARED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))  # an empty gcloud config: no ADC file
    monkeypatch.setattr(errors, "identity", None)
    if gcp.on_google_cloud():
        pytest.skip("on a Google Cloud VM the VM's service account is a credential")
    return os.environ.copy()


def assert_one_line_about(error: str, *names: str) -> None:
    assert "\n" not in error, error
    assert "needs Google Cloud credentials" in error and "gcloud auth application-default login" in error, error
    assert "GOOGLE_APPLICATION_CREDENTIALS" in error and all(name in error for name in names), error


def test_the_training_image_uses_the_metadata_servers_credentials(no_credentials, monkeypatch):
    """In the project's image (ON_GOOGLE_CLOUD=1, the Dockerfile's) the job's service account is the
    credential even where the container does not see the host's DMI: training asks the metadata
    server (here conftest's closed port) instead of refusing for want of a key file."""
    monkeypatch.setenv("ON_GOOGLE_CLOUD", "1")
    assert gcp.on_google_cloud()
    with pytest.raises(UserError) as raised:
        train.main(["--config", LOCAL, f"data.dir={BUCKET}/tfrecords"])
    assert "the VM's service account" in str(raised.value) and "needs Google Cloud credentials" not in str(raised.value)


@pytest.mark.parametrize(
    "main, argv, names",
    [
        (preprocess.main, ["--input", str(PROJECT), "--output", f"{BUCKET}/tfrecords"], ["--output"]),
        (train.main, ["--config", LOCAL, f"data.dir={BUCKET}/tfrecords"], ["data.dir=gs://my-tpu-bucket"]),
        (evaluate.main, ["--config", LOCAL, f"runtime.output_dir={BUCKET}/runs/a"], ["runtime.output_dir"]),
        (predict.main, ["--run", f"{BUCKET}/runs/a", "x"], ["--run=gs://my-tpu-bucket/runs/a"]),
    ],
    ids=["preprocess", "train", "evaluate", "predict"],
)
def test_each_entry_point_refuses_gs_paths_without_credentials(no_credentials, main, argv, names):
    with pytest.raises(UserError) as raised:
        main(argv)
    assert_one_line_about(str(raised.value), *names)


def test_the_doctor_plans_the_tpu_config_without_credentials(no_credentials, capsys):
    """`make doctor CONFIG=configs/tpu.yaml` on a laptop: the gs:// paths are one WARN with the fix,
    the rules that would read them skip, and the plan runs: the memory plan of the TPU chip, the
    FLOPs of a step, the batch rules, the support matrix. No FAIL, no traceback. On a v4-8 (4 chips of
    275 TFLOP/s), whatever TPU type the project was generated for."""
    argv = ["--config", str(PROJECT / "configs/tpu.yaml"), "--tpu_type", "v4-8", f"data.dir={BUCKET}/tfrecords"]
    status = doctor.main(argv)
    lines = {
        line.split()[1]: line
        for line in capsys.readouterr().out.splitlines()
        if line[:4] in ("PASS", "WARN", "FAIL", "SKIP")
    }
    assert status == 0, lines
    credentials = lines["data.credentials"]
    assert credentials.startswith("WARN") and "needs Google Cloud credentials" in credentials, credentials
    assert (
        "gcloud auth application-default login" in credentials
        and "data.dir=gs://my-tpu-bucket/tfrecords" in credentials
    )
    assert (
        lines["data.manifest"].startswith("SKIP") and "not read, no Google Cloud credentials" in lines["data.manifest"]
    )
    for skipped in ("input.static_shapes", "data.shard_count", "data.shard_size"):
        assert lines[skipped].startswith("SKIP"), lines[skipped]
    assert lines["model.memory"][:4] in ("PASS", "WARN") and "HBM per v4 chip" in lines["model.memory"], lines
    assert lines["model.flops"].startswith("PASS") and "GFLOP per optimizer step" in lines["model.flops"], lines
    assert "ms a step at 275 TFLOP/s per chip x 4 chips" in lines["model.flops"], lines["model.flops"]
    assert lines["batch.divisible"].startswith("PASS") and lines["tpu.support"][:4] in ("PASS", "WARN")


def test_local_paths_need_no_credentials(no_credentials):
    assert gcp.require_credentials({"data.dir": "data/tfrecords", "runtime.output_dir": None}) is None


def test_the_emulator_needs_no_credentials(no_credentials, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    assert gcp.require_credentials({"data.dir": f"{BUCKET}/tfrecords"}) == "the local storage emulator"
    with pytest.raises(UserError, match="the Dataflow runner needs Google Cloud credentials"):
        gcp.require_credentials({"--input": f"{BUCKET}/raw"}, service="the Dataflow runner")


def test_a_key_file_that_is_not_there_is_named(no_credentials, monkeypatch, tmp_path):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing-key.json"))
    with pytest.raises(UserError, match="missing-key.json is not a file"):
        gcp.require_credentials({"data.dir": f"{BUCKET}/tfrecords"})


# Beam's retries of the token request took about two minutes; the check before the pipeline fails
# in a few seconds (about 3 s on a busy 2-core machine, most of it Python start-up). A bound of
# 60 s leaves room for a loaded CI machine and still fails if a retry loop comes back.
FAIL_FAST_BOUND_S = 60


def test_the_dataflow_dry_run_from_make_stops_in_one_line(no_credentials):
    """The reported case: `make preprocess RUNNER=dataflow DRY_RUN=1` with gs:// paths on a laptop
    without credentials used to print Beam's retry tracebacks for two minutes."""
    started = time.monotonic()
    result = subprocess.run(
        [
            "make",
            "preprocess",
            "RUNNER=dataflow",
            "DRY_RUN=1",
            f"RAW={BUCKET}/raw",
            f"DATA_DIR={BUCKET}/tfrecords",
            f"VENV={sys.prefix}",
        ],
        cwd=PROJECT,
        env=no_credentials,
        capture_output=True,
        text=True,
        timeout=300,
    )
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    # Every gs:// path the command needs, the two the Makefile adds for Dataflow included.
    staging = "gs://{{ cookiecutter.gcs_bucket }}/dataflow"
    needs = (
        f"--input={BUCKET}/raw, --output={BUCKET}/tfrecords, "
        f"--temp_location={staging}/tmp, --staging_location={staging}/staging"
    )
    error = f"error: {needs} needs Google Cloud credentials and this machine has none: {gcp.FIX}"
    # The one line, then make's own line about the failed recipe; nothing else (no retries, no traceback).
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0] == error, result.stderr[-3000:]
    # ("make[1]:" when this suite itself runs under make, e.g. `make test`.)
    assert re.fullmatch(r"make(\[\d+\])?: \*\*\* \[Makefile:\d+: preprocess\] Error \d+", lines[1]), lines[1]
    assert elapsed < FAIL_FAST_BOUND_S, f"failed after {elapsed:.0f} s, not at once"


@pytest.mark.parametrize("gcloud", ["gcloud", "/nonexistent/gcloud"])
def test_tpu_targets_need_a_gcloud_login(no_credentials, tmp_path, gcloud):
    if gcloud == "gcloud" and subprocess.run(["which", "gcloud"], capture_output=True).returncode:
        pytest.skip("gcloud is not installed here; the other case covers a missing gcloud")
    result = subprocess.run(
        ["make", "tpu-list", f"GCLOUD={gcloud}"], cwd=PROJECT, env=no_credentials, capture_output=True, text=True
    )
    assert result.returncode != 0
    expected = "gcloud has no account to act as: run gcloud auth login" if gcloud == "gcloud" else "is not installed"
    assert result.stderr.startswith("error: ") and expected in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 2  # the error, and make's own line about the target
    dry = subprocess.run(
        ["make", "tpu-list", f"GCLOUD={gcloud}", "DRY_RUN=1"], cwd=PROJECT, env=no_credentials, capture_output=True
    )
    assert dry.returncode == 0  # a dry run needs no login


@pytest.mark.parametrize(
    "error",
    [
        # What Beam's GCS listing raises for a bucket the identity may not read.
        api_exceptions.Forbidden(
            "GET https://storage.googleapis.com/storage/v1/b/other-team-bucket/o?prefix=raw%2F: "
            "trainer@acme.iam.gserviceaccount.com does not have storage.objects.list access to the Google "
            "Cloud Storage bucket. Permission 'storage.objects.list' denied on resource (or it may not exist)."
        ),
        # What TensorFlow's gs:// filesystem raises when writing a checkpoint there.
        tf.errors.PermissionDeniedError(
            None,
            None,
            "Error executing an HTTP request: HTTP response code 403 with body 'Forbidden' when initiating "
            "an upload to gs://other-team-bucket/runs/a/checkpoints/ckpt-1.index",
        ),
    ],
    ids=["beam", "tensorflow"],
)
def test_a_403_names_the_bucket_and_the_identity(monkeypatch, capsys, error):
    monkeypatch.setattr(errors, "identity", "trainer@acme.iam.gserviceaccount.com")

    def main(argv):
        raise error

    with pytest.raises(SystemExit) as exited:
        run_cli(main, [])
    assert exited.value.code == 2
    printed = capsys.readouterr().err.strip()
    assert "\n" not in printed and printed.startswith("error: trainer@acme.iam.gserviceaccount.com may not use ")
    assert "gs://other-team-bucket (403 Forbidden)" in printed
    assert "--member=serviceAccount:trainer@acme.iam.gserviceaccount.com" in printed


def test_other_errors_keep_their_traceback():
    def main(argv):
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        run_cli(main, [])
