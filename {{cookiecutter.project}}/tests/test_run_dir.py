"""The run record (metrics.json): read once, written whole by one writer, never left broken; and the
records kept across runs (the steps_per_execution choice, the host's peak) written the same way."""

from __future__ import annotations

import signal
import subprocess
import sys

import numpy as np
import pytest

from conftest import PROJECT
from {{ cookiecutter.package }}.core.errors import UserError
from {{ cookiecutter.package }}.core.run_dir import RunRecord

# Writes a record, then a new one through the real write with a hook that kills the process at
# `argv[2]`: half of the new content flushed to its file, or the content written but not yet renamed.
KILLED_WRITER = """
import os, signal, sys
import tensorflow as tf
from {{ cookiecutter.package }}.core.run_dir import RunRecord

record = RunRecord(sys.argv[1])
record.values = {"version": 0, "padding": "a" * 100_000}
record.write()
write, rename = tf.io.gfile.GFile.write, tf.io.gfile.rename

def half_then_killed(handle, content):
    write(handle, content[: len(content) // 2])
    handle.flush()
    os.kill(os.getpid(), signal.SIGKILL)

def killed_before_renaming(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

if sys.argv[2] == "mid-write":
    tf.io.gfile.GFile.write = half_then_killed
else:
    tf.io.gfile.rename = killed_before_renaming
record.values = {"version": 1, "padding": "b" * 100_000}
record.write()
"""


def test_updates_keep_what_they_do_not_renew(tmp_path):
    record = RunRecord(str(tmp_path))
    assert record.values == {}
    record.update(calibration={"steps_per_execution": 4}, global_step=8)
    record.write()
    again = RunRecord(str(tmp_path))
    again.update(global_step=16)
    again.write()
    assert RunRecord(str(tmp_path)).values == {"calibration": {"steps_per_execution": 4}, "global_step": 16}
    assert [path.name for path in tmp_path.iterdir()] == ["metrics.json"]  # no temporary file left


def test_the_keys_read_in_several_places_have_names(tmp_path):
    record = RunRecord(str(tmp_path))
    assert (record.starts, record.last_start, record.history, record.calibration) == ([], None, [], None)
    starts = [{"initial_step": 0, "furthest_step": 8, "end": "preempted"}, {"initial_step": 8, "end": "finished"}]
    record.update(
        goodput={"per_start": starts},
        history=[{"step": 4, "loss": 1.0}],
        calibration={"steps_per_execution": 4},
        examples_per_second=12.5,
    )
    record.write()
    again = RunRecord(str(tmp_path))
    assert again.starts == starts and again.last_start == starts[-1] and again.history == [{"step": 4, "loss": 1.0}]
    assert again.calibration == {"steps_per_execution": 4} and again.examples_per_second == 12.5


def test_a_broken_record_is_one_line_naming_the_file(tmp_path):
    (tmp_path / "metrics.json").write_text('{"global_step": 4')
    with pytest.raises(UserError, match=r"metrics.json is not valid JSON .*; move it away") as error:
        RunRecord(str(tmp_path))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("killed", ["mid-write", "before-rename"])
def test_a_writer_killed_mid_write_leaves_the_old_record(tmp_path, killed):
    """SIGKILLed with half of the new record written, or with all of it written but not in place:
    metrics.json is the old record, whole."""
    env = {"PYTHONPATH": str(PROJECT / "src"), "PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(tmp_path), killed],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    assert RunRecord(str(tmp_path)).values == {"version": 0, "padding": "a" * 100_000}


def test_a_failed_write_of_the_steps_per_execution_cache_leaves_the_stored_choice(tmp_path):
    """A new record that fails half-way (a value JSON cannot hold) is not written over the old one."""
    from {{ cookiecutter.package }}.core import steps_per_execution as spe

    key = {"task": "a task", "replicas": 8}
    path = spe.cache_path(str(tmp_path), key)
    chosen = spe.Measurement(4, 10.0, [10.0])
    stored = spe.record(key, chosen, [chosen])
    spe.write_cache(path, stored)
    broken = {**stored, "measurements": [*stored["measurements"], {"steps_per_execution": 16, "rounds": {9.5}}]}
    with pytest.raises(TypeError, match="not JSON serializable"):
        spe.write_cache(path, broken)
    assert spe.read_cache(path, key) == stored
    assert [entry.name for entry in (tmp_path / "steps_per_execution").iterdir()] == [path.rsplit("/", 1)[1]]


def test_a_failed_write_of_the_host_peak_leaves_the_stored_peaks(tmp_path):
    from {{ cookiecutter.package }}.core import utilisation
    from {{ cookiecutter.package }}.core.topology import Target

    path = utilisation.store_host_peak(str(tmp_path), "float32", 1.5e12)
    before = open(path).read()
    with pytest.raises(TypeError, match="not JSON serializable"):  # a NumPy scalar, not a float
        utilisation.store_host_peak(str(tmp_path), "bfloat16", np.float32(3e12))
    assert open(path).read() == before
    assert utilisation.peak_per_chip(Target("cpu", 8, 1), "float32", str(tmp_path))[0] == 1.5e12
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["host_peak.json"]


def test_a_checkpoint_without_the_random_generators_restores_the_rest_and_says_so(tmp_path, capsys):
    """A checkpoint written before the model's random generators were saved: its weights and optimizer
    state are restored, one line says the dropout masks are drawn afresh, and the model keeps its
    generators for the checkpoints it writes from then on."""
    import tensorflow as tf

    from {{ cookiecutter.package }}.core import model as model_lib, run_dir
    from {{ cookiecutter.package }}.core.keras import keras

    def model_and_optimizer(seed: int):
        keras.utils.set_random_seed(seed)
        keras.backend.experimental.enable_tf_random_generator()
        inputs = keras.Input((3,))
        model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Dropout(0.5)(inputs)))
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
        return model, optimizer

    old, optimizer = model_and_optimizer(1)  # its generators are not tracked: an older checkpoint
    tf.train.CheckpointManager(tf.train.Checkpoint(model=old, optimizer=optimizer), str(tmp_path), 2).save(7)
    new, optimizer = model_and_optimizer(2)
    model_lib.track_random_generators(new)
    assert new.random_generators and not np.array_equal(new.get_weights()[0], old.get_weights()[0])
    checkpoint = tf.train.Checkpoint(model=new, optimizer=optimizer)
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path), 2)
    assert run_dir.restore_newest_readable(checkpoint, manager).endswith("ckpt-7")
    assert all(np.array_equal(a, b) for a, b in zip(new.get_weights(), old.get_weights()))
    printed = capsys.readouterr().out
    assert "holds no random generators" in printed and "cannot be read" not in printed, printed
    manager.save(8)
    saved = [name for name, _ in tf.train.list_variables(manager.latest_checkpoint)]
    assert any(name.startswith(run_dir.GENERATORS) for name in saved), saved
