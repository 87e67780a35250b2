"""`make gke-manifest` (launch/gke.py): the printed YAML is read back and every document checked
against the Kubernetes API's schema (kubernetes-validate, strict: no unknown or missing field) and
the official Python client's models (nothing dropped or retyped on the way in); no cluster, no
network. Refusals are one line and exit status 2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml
from kubernetes.client import ApiClient

from conftest import PROJECT
from {{ cookiecutter.package }}.core.errors import UserError, run_cli
from {{ cookiecutter.package }}.launch import PROJECT as NAME
from {{ cookiecutter.package }}.launch import gke, image_uri, train_command

# The first release with podFailurePolicy GA, and the newest schema the package holds.
K8S_VERSIONS = ("1.31.0", kubernetes_validate.latest_version())
REMOTE = ("data.dir=gs://b/tfrecords", "runtime.output_dir=gs://b/runs/x")
LOCAL_RUN = ("data.dir=gs://b/tfrecords", "runtime.output_dir=runs/x")
ARGS = ["--config", "configs/tpu.yaml", "--project", "p", "--region", "us-east5", "--service_account", "trainer"]


def printed(capsys, *argv: str) -> list[dict]:
    """The documents `make gke-manifest` prints for `argv`, each checked against schema and client."""
    assert gke.main([*ARGS, *argv]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    api = ApiClient()
    for doc in docs:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
        model = api._ApiClient__deserialize(doc, f"V1{doc['kind']}")
        assert api.sanitize_for_serialization(model) == doc, f"the client's V1{doc['kind']} changed the document"
    return docs


@pytest.fixture(autouse=True)
def in_project(monkeypatch):
    monkeypatch.chdir(PROJECT)  # config paths are the project's, as in the image


@pytest.mark.parametrize(
    "tpu_type, accelerator, grid, chips",
    [
        ("v5litepod-8", "tpu-v5-lite-podslice", "2x4", 8),
        ("v4-8", "tpu-v4-podslice", "2x2x1", 4),
        ("v5p-8", "tpu-v5p-slice", "2x2x1", 4),
        ("v6e-8", "tpu-v6e-slice", "2x4", 8),
    ],
)
def test_the_pod_selects_the_slice_and_requests_every_chip_of_its_host(capsys, tpu_type, accelerator, grid, chips):
    account, job = printed(capsys, "--tpu_type", tpu_type, "--image_tag", "v1", *REMOTE)
    assert (account["kind"], job["kind"]) == ("ServiceAccount", "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": accelerator,
        "cloud.google.com/gke-tpu-topology": grid,
    }
    (container,) = pod["containers"]
    tpus = {"google.com/tpu": str(chips)}
    assert container["resources"] == {"requests": tpus, "limits": tpus}
    assert container["image"] == image_uri("p", "us-east5", "v1")
    assert container["command"] == train_command("configs/tpu.yaml", REMOTE)
    assert pod["serviceAccountName"] == account["metadata"]["name"] == "trainer"


def test_a_preempted_pod_is_replaced_without_counting_and_a_crash_counts(capsys):
    """The Job's podFailurePolicy, read the way the Job controller reads it (the first rule that
    matches; no match counts towards backoffLimit), for each way a training pod ends."""
    (_, job) = printed(capsys, "--tpu_type", "v5litepod-8", *REMOTE)
    spec = job["spec"]
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # podFailurePolicy requires it
    assert spec["podReplacementPolicy"] == "Failed"  # no second writer while the first still saves

    def action(exit_code: int, conditions=()):
        for rule in spec["podFailurePolicy"]["rules"]:
            codes = rule.get("onExitCodes")
            if codes and codes["operator"] == "In" and exit_code in codes["values"]:
                return rule["action"]
            if any((c["type"], c["status"]) in conditions for c in rule.get("onPodConditions", [])):
                return rule["action"]
        return "Count"

    def one_line_error(argv):
        raise UserError("a mistake")

    with pytest.raises(SystemExit) as user_error:
        run_cli(one_line_error, [])
    capsys.readouterr()
    assert action(128 + signal.SIGTERM) == "Ignore"  # SIGTERM: checkpoint saved, exit 143 (train.py)
    assert action(137, [("DisruptionTarget", "True")]) == "Ignore"  # killed by a node shutdown or eviction
    assert action(user_error.value.code) == "FailJob"  # a retry would print the same line
    assert action(1) == "Count" and action(137) == "Count"  # a crash, an out-of-memory kill
    assert 1 <= spec["backoffLimit"] <= 5


def test_spot_and_the_job_named_after_its_run(capsys):
    run = "runtime.output_dir=gs://b/runs/My_Run.2/"
    (_, job) = printed(capsys, "--tpu_type", "v6e-8", "--spot", "--namespace", "ml", REMOTE[0], run)
    assert job["spec"]["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
    assert job["metadata"] == {"name": f"{NAME}-my-run-2", "namespace": "ml"}


@pytest.mark.parametrize(
    "tpu_type, overrides, config, expected",
    [
        ("v4-16", REMOTE, "configs/tpu.yaml", "multi-host slice (2 hosts)"),
        ("v5litepod-16", REMOTE, "configs/tpu.yaml", "make pod-train"),
        ("v3-8", REMOTE, "configs/tpu.yaml", "cover v4, v5litepod, v5p, v6e"),
        ("v5litepod-8", REMOTE[1:], "configs/tpu.yaml", "which a GKE pod cannot read: pass data.dir=gs://"),
        ("v5litepod-8", LOCAL_RUN, "configs/tpu.yaml", "runtime.output_dir=gs://"),
        ("v5litepod-8", REMOTE, os.devnull, "not a file of this project"),
    ],
)
def test_what_cannot_run_there_is_refused_in_one_line(tpu_type, overrides, config, expected):
    argv = [*ARGS[2:], "--config", config, "--tpu_type", tpu_type, *overrides]
    result = subprocess.run(
        [sys.executable, "-m", "{{ cookiecutter.package }}.launch.gke", *argv],
        cwd=PROJECT,
        env={**os.environ, "PYTHONPATH": str(PROJECT / "src")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert expected in result.stderr
