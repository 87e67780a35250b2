"""`make parity` on a task added with `make new-task`, as a team would meet it.

The model gets a noise layer of its own (uniform noise on the features in training, no Keras Dropout,
so parity cannot switch it off): parity says that the model draws random numbers in training, names the
layer, gives no verdict on the replicas and exits non-zero; the same task without the layer agrees and
exits 0. Then the task gets a step loss that weights each example by a count of 1 +- 1% (as a masked
language model counts its masked tokens) and divides by its replica's own total: the curves differ by
less than 1e-3 and by far more than summation order explains, and parity does not agree, naming the
step loss; with `core.model.global_mean` it agrees."""

from __future__ import annotations

import re
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


# Appended to the new task's task.py: a step loss instead of its mean squared error. DIVIDED is the
# division: by this replica's own total count, or the global batch's (global_mean).
STEP_LOSS = '''

import tensorflow as tf  # noqa: E402

from ...core.model import global_mean  # noqa: E402


def _build_step_loss(self, objective_config, manifest):
    def step_loss(model, features, targets, outputs, weights):
        errors = tf.square(outputs[:, 0] - targets[:, 0])
        counts = 1.0 + 0.01 * tf.sin(1000.0 * features[:, 0])  # 1 +- 1% an example
        if weights is not None:
            counts *= tf.cast(weights, tf.float32)
        return DIVIDED

    return step_loss


type(TASK).build_step_loss = _build_step_loss
'''
OWN_COUNT = "tf.reduce_sum(errors * counts) / tf.reduce_sum(counts)"
GLOBAL_COUNT = "global_mean(errors, counts)"


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

    # A step loss: each replica's own mean, then the global batch's.
    task_py = project / "src/noise_lab/tasks" / name / "task.py"
    task = task_py.read_text()
    task_py.write_text(task + STEP_LOSS.replace("DIVIDED", OWN_COUNT))
    own = run_make(project, "parity", config, "PARITY_STEPS=3")
    output = own.stdout + own.stderr
    assert own.returncode != 0, output[-6000:]
    assert "Traceback" not in output and "verdict: agree" not in output, output[-6000:]
    parted = re.search(r"^verdict: the curves part at step 0 \(difference (\S+), beyond bound (\S+): ", output,
                       re.MULTILINE)
    assert parted, output[-6000:]
    difference, bound = float(parted.group(1)), float(parted.group(2))
    assert bound * 10 < difference < 1e-3, output[-6000:]  # a fixed tolerance of 1e-3 would have agreed
    assert "the task's step loss (build_step_loss) is the likeliest cause" in output, output[-6000:]
    assert "core.model.global_mean(values, weights)" in output, output[-6000:]

    task_py.write_text(task + STEP_LOSS.replace("DIVIDED", GLOBAL_COUNT))
    output = succeeds(run_make(project, "parity", config, "PARITY_STEPS=3"))
    agreed = re.search(r"^verdict: agree: 8 replicas train as one device does \(largest difference (\S+), within "
                       r"bound (\S+): ", output, re.MULTILINE)
    assert agreed and float(agreed.group(1)) <= float(agreed.group(2)) < 1e-5, output[-6000:]
