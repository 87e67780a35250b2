"""`make parity` on a task added with `make new-task`, as a team would meet it: the model gets a noise
layer of its own (uniform noise on the features in training, no Keras Dropout, so parity cannot switch
it off). Parity says that the model draws random numbers in training, names the layer, gives no verdict
on the replicas and exits non-zero; the same task without the layer agrees and exits 0."""

from __future__ import annotations

import subprocess

import pytest

from conftest import VENV, bake, project_env

pytestmark = pytest.mark.slow

# Appended to the new task's model.py: its network, with the noise layer in front of it.
NOISE_LAYER = '''

import tensorflow as tf  # noqa: E402


class Jitter(keras.layers.Layer):
    """Uniform noise of +-0.005 on the raw features in training: a regulariser of the team's own."""

    def call(self, inputs, training=None):
        if not training:
            return inputs
        return inputs + 0.005 * tf.random.uniform(tf.shape(inputs), -1.0, 1.0, inputs.dtype)


_network = build_model


def build_model(*args, **kwargs):
    network = _network(*args, **kwargs)
    features = keras.Input(network.input.shape[1:], dtype=network.input.dtype, name="features")
    return keras.Model(features, network(Jitter(name="jitter")(features)), name=network.name)
'''


def run_make(project, *targets) -> subprocess.CompletedProcess:
    return subprocess.run(["make", *targets, f"VENV={VENV}"], cwd=project, env=project_env(), capture_output=True,
                          text=True, timeout=1200)


def succeeds(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"{' '.join(result.args)} failed:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    return result.stdout + result.stderr


def test_parity_names_a_new_tasks_noise_layer_and_agrees_without_it(tmp_path):
    project = bake(tmp_path, project="noise-lab", gcp_project="acme-ml-research", zone="us-central2-b",
                   gcs_bucket="acme-tpu-data")
    name = "jittered_regression"
    assert f"task {name} added" in succeeds(run_make(project, "new-task", f"NAME={name}"))
    config = f"CONFIG=configs/{name}/local.yaml"
    succeeds(run_make(project, "data", config, "SMALL=1"))
    succeeds(run_make(project, "preprocess", config))
    model_py = project / "src/noise_lab/tasks" / name / "model.py"
    network = model_py.read_text()
    model_py.write_text(network + NOISE_LAYER)

    noisy = run_make(project, "parity", config, "PARITY_STEPS=3")
    output = noisy.stdout + noisy.stderr
    assert noisy.returncode != 0, output[-6000:]
    assert "verdict: none: the model draws random numbers in training" in output, output[-6000:]
    assert "Drawn in: jitter (RandomUniform)." in output, output[-6000:]
    assert "verdict: agree" not in output and "Traceback" not in output, output[-6000:]

    model_py.write_text(network)  # the layer removed
    output = succeeds(run_make(project, "parity", config, "PARITY_STEPS=3"))
    assert "verdict: agree: 8 replicas train as one device does" in output, output[-6000:]
    assert "noise floor: the same 3 steps again on one device from the same weights: largest difference 0.0e+00" \
        in output, output[-6000:]
