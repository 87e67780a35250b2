"""Checkpoints written in the background (`train.async_checkpoint`): a save holds training only
while the variables are copied to host memory, yet every checkpoint the run directory names is
whole, a preemption still ends in a whole checkpoint that a restart resumes from exactly, and the
seconds the saves held training reach the log, TensorBoard, metrics.json and goodput."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
import signal
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from conftest import PROJECT, finished_run_of
from test_train import scalar_events, train_command
from {{ cookiecutter.package }} import tasks, train
from {{ cookiecutter.package }}.core import callbacks, goodput
from {{ cookiecutter.package }}.core.keras import keras


def dense_model(steps_per_execution: int):
    model = keras.Sequential([keras.layers.Dense(16, input_shape=(3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", steps_per_execution=steps_per_execution)
    return model


def fit(model, callback_list, steps: int) -> None:
    features = np.random.default_rng(0).normal(size=(4 * steps, 3)).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((features, features.sum(axis=1, keepdims=True))).batch(4).repeat()
    model.fit(dataset, epochs=1, steps_per_epoch=steps, callbacks=callback_list, verbose=0)


class Weights(callbacks.BetweenExecutions):
    """After the callbacks before it, at each execution's end: the model's weights and the newest
    checkpoint that `folder`'s index names, by step; that checkpoint is read whole there and then."""

    def __init__(self, folder):
        super().__init__(0)
        self.folder, self.at, self.named = str(folder), {}, {}

    def on_execution_end(self, step, previous, logs):
        self.at[step] = self.model.get_weights()
        named = tf.train.latest_checkpoint(self.folder)
        if named:
            reader = tf.train.load_checkpoint(named)  # raises on a missing or cut file, as get_tensor does
            for name in reader.get_variable_to_shape_map():
                reader.get_tensor(name)
            self.named[step] = int(named.rsplit("-", 1)[1])


class SigtermAt(callbacks.BetweenExecutions):
    def __init__(self, step: int):
        super().__init__(0)
        self.at = step

    def on_execution_end(self, step, previous, logs):
        if step == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


def steps_of(manager) -> list[int]:
    return [int(path.rsplit("-", 1)[1]) for path in manager.checkpoints]


def assert_holds(model, path: str, weights: list) -> None:
    tf.train.Checkpoint(model=model).restore(path).expect_partial()
    for restored, wanted in zip(model.get_weights(), weights):
        np.testing.assert_array_equal(restored, wanted)


def test_background_saves_rotate_and_each_holds_the_weights_of_its_step(float32_policy, tmp_path, capsys):
    model = dense_model(steps_per_execution=2)
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=model, optimizer=model.optimizer), str(tmp_path), max_to_keep=2
    )
    report, weights = callbacks.Report(step=0), Weights(tmp_path)
    saves = callbacks.Checkpoints(0, manager, checkpoint_every=2, report=report, asynchronous=True)
    fit(model, [saves, weights], steps=8)  # the weights and the index are read after each save, while it writes
    held = list(report.checkpoint_blocking_seconds)
    callbacks.save_checkpoint(manager, 8, report)  # the trainer's last save: step 8 is being written already
    assert steps_of(manager) == [6, 8] and tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-8")
    assert not tf.io.gfile.glob(f"{tmp_path}/ckpt-2.*") and not tf.io.gfile.glob(f"{tmp_path}/ckpt-4.*")
    for step in (6, 8):
        assert_holds(model, f"{tmp_path}/ckpt-{step}", weights.at[step])
    # Four saves, each timed once; the last save's wait for step 8's files is added to step 8's.
    assert len(report.checkpoint_blocking_seconds) == 4 and len(report.checkpoint_write_seconds) == 4
    assert report.checkpoint_blocking_seconds[:3] == held[:3] and report.checkpoint_blocking_seconds[3] >= held[3]
    printed = capsys.readouterr().out
    lines = [line for line in printed.splitlines() if line.startswith("checkpoint")]
    assert [re.sub(r"[\d.]+ s$", "X s", line) for line in lines] == [
        f"checkpoint at step {step} saving in the background: training held X s" for step in (2, 4, 6, 8)
    ]
    # Step 2 is the first boundary and a save: what it held is the set-up's seconds and the save's.
    (set_up,) = re.findall(r"^background checkpoint saves set up at step 2: training held ([\d.]+) s", printed, re.M)
    saved = float(re.search(r"held ([\d.]+) s$", lines[0])[1])
    assert float(set_up) > 0.001 and held[0] >= float(set_up) + saved - 0.001  # each printed to 3 places


class CopyTraces(callbacks.BetweenExecutions):
    """After the callbacks before it, at each execution's end: how many times the background saves'
    copy function has been traced (None: no background save set up yet)."""

    def __init__(self, checkpoint):
        super().__init__(0)
        self.checkpoint, self.at = checkpoint, {}

    def on_execution_end(self, step, previous, logs):
        helper = self.checkpoint._async_checkpointer_impl
        self.at[step] = helper._copy_to_cpu.experimental_get_tracing_count() if helper else None


def test_background_saves_are_set_up_at_the_first_boundary_and_each_save_copies_its_step(
    float32_policy, tmp_path, capsys
):
    """The first boundary sets up the background saves (the host copy, its copy function traced):
    no save traces anything after it, and each save still holds the weights of its own step."""
    model = dense_model(steps_per_execution=2)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=5)
    report, weights, traces = callbacks.Report(step=0), Weights(tmp_path), CopyTraces(checkpoint)
    saves = callbacks.Checkpoints(0, manager, checkpoint_every=4, report=report, asynchronous=True)
    fit(model, [saves, traces, weights], steps=12)
    manager.sync()
    assert traces.at == {2: 1, 4: 1, 6: 1, 8: 1, 10: 1, 12: 1}  # traced at step 2, before any save
    assert steps_of(manager) == [4, 8, 12]
    for step in (4, 8, 12):
        assert_holds(model, f"{tmp_path}/ckpt-{step}", weights.at[step])
    # The set-up held training at step 2: an entry of its own before the three saves'.
    assert len(report.checkpoint_blocking_seconds) == 4 and len(report.checkpoint_write_seconds) == 3
    printed = capsys.readouterr().out
    assert printed.count("background checkpoint saves set up at step 2: training held") == 1


def test_a_first_boundary_saved_already_holds_the_set_up_alone_and_logs_all_it_held(float32_policy, tmp_path, capsys):
    """At a first boundary whose step the newest checkpoint holds already, nothing is saved: the
    background saves' set-up is an entry of its own, and TensorBoard's checkpoint_blocking_seconds
    at that step holds the set-up with the (nil) save. A second fit over the same checkpoint has
    nothing to set up."""
    model = dense_model(steps_per_execution=2)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path / "checkpoints"), max_to_keep=5)
    manager.save(checkpoint_number=2)
    report, writer = callbacks.Report(step=0), tf.summary.create_file_writer(str(tmp_path / "logs"))
    saves = callbacks.Checkpoints(0, manager, checkpoint_every=2, report=report, asynchronous=True, writer=writer)
    started = time.perf_counter()
    fit(model, [saves], steps=4)
    wall = time.perf_counter() - started
    manager.sync()
    writer.flush()
    (set_up,) = re.findall(r"saves set up at step 2: training held ([\d.]+) s", capsys.readouterr().out)
    held = report.checkpoint_blocking_seconds
    assert steps_of(manager) == [2, 4] and len(held) == 2 and held[0] == pytest.approx(float(set_up), abs=1e-3)
    assert 0 < float(set_up) < wall  # a span of the fit
    logged = scalar_events(tmp_path / "logs")["checkpoint_blocking_seconds"]
    assert logged[2] >= held[0] - 1e-6 and logged[4] == pytest.approx(held[1], rel=1e-5)
    # A later fit in this process (its checkpoint's background saves set up already) sets up nothing.
    later = callbacks.Report(step=4)
    fit(model, [callbacks.Checkpoints(4, manager, checkpoint_every=2, report=later, asynchronous=True)], steps=4)
    manager.sync()
    printed = capsys.readouterr().out
    held = re.findall(r"checkpoint at step (\d+) saving in the background: training held ([\d.]+) s", printed)
    assert [int(step) for step, _ in held] == [6, 8] and "set up" not in printed
    assert later.checkpoint_blocking_seconds == pytest.approx([float(seconds) for _, seconds in held], abs=1e-3)


def test_no_set_up_without_a_save_in_the_fit_nor_for_synchronous_saves(float32_policy, tmp_path, capsys):
    for every, asynchronous in ((100, True), (4, False)):
        model = dense_model(steps_per_execution=2)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
        manager = tf.train.CheckpointManager(checkpoint, str(tmp_path / str(every)), max_to_keep=5)
        report, traces = callbacks.Report(step=0), CopyTraces(checkpoint)
        saves = callbacks.Checkpoints(0, manager, checkpoint_every=every, report=report, asynchronous=asynchronous)
        fit(model, [saves, traces], steps=8)
        assert set(traces.at.values()) == {None}  # nothing set up in the background
        assert len(report.checkpoint_blocking_seconds) == len(manager.checkpoints) == (0 if every == 100 else 2)
    assert "background checkpoint saves set up" not in capsys.readouterr().out


def test_a_preemption_at_a_background_save_waits_for_it_and_writes_it_once(float32_policy, tmp_path):
    """SIGTERM lands on a boundary where a checkpoint is being written in the background: the
    preemption's save waits for that one and does not write the same step again."""
    model = dense_model(steps_per_execution=2)
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=model, optimizer=model.optimizer), str(tmp_path), max_to_keep=5
    )
    report, weights = callbacks.Report(step=0), Weights(tmp_path)
    saves = callbacks.Checkpoints(0, manager, checkpoint_every=2, report=report, asynchronous=True)
    stop = callbacks.Preemption(0, manager, poll_seconds=60, report=report)
    with stop.watching():
        fit(model, [SigtermAt(4), saves, stop, weights], steps=20)
    assert report.stop == callbacks.Stop(goodput.PREEMPTED, "SIGTERM")
    assert weights.named[4] == 4  # whole and named as soon as the preemption's save returned
    assert steps_of(manager) == [2, 4] and tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-4")
    assert len(report.checkpoint_blocking_seconds) == 2 and len(report.checkpoint_write_seconds) == 2
    assert_holds(model, f"{tmp_path}/ckpt-4", weights.at[4])


def test_a_preemption_between_background_saves_ends_in_a_whole_checkpoint_of_its_step(float32_policy, tmp_path):
    """SIGTERM between checkpoint boundaries: the save in flight is finished, then the preemption's
    own is written synchronously; both are whole and the index names the preemption's."""
    model = dense_model(steps_per_execution=2)
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=model, optimizer=model.optimizer), str(tmp_path), max_to_keep=5
    )
    report, weights = callbacks.Report(step=0), Weights(tmp_path)
    saves = callbacks.Checkpoints(0, manager, checkpoint_every=4, report=report, asynchronous=True)
    stop = callbacks.Preemption(0, manager, poll_seconds=60, report=report)
    with stop.watching():
        fit(model, [SigtermAt(6), saves, stop, weights], steps=20)
    assert weights.named[6] == 6  # whole and named as soon as the preemption's save returned
    assert steps_of(manager) == [4, 6] and tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-6")
    for step in (4, 6):
        assert_holds(model, f"{tmp_path}/ckpt-{step}", weights.at[step])


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """The project's task's shared short run (conftest.finished_run_of): 48 steps on 8 replicas in
    bfloat16, a checkpoint every 8 steps (in the background by default), an evaluation every 16."""
    cfg, output, metrics, _ = finished_run_of(tasks.DEFAULT, tmp_path_factory)
    return cfg, output, metrics


def test_the_seconds_saves_held_training_reach_tensorboard_the_record_and_goodput(finished_run):
    cfg, output, metrics = finished_run
    held = scalar_events(output / "logs" / "train")["checkpoint_blocking_seconds"]
    assert sorted(held) == [8, 16, 24, 32, 40, 48] and all(seconds > 0 for seconds in held.values())
    written = json.loads((output / "metrics.json").read_text())
    assert written["checkpoint_blocking_seconds"] >= sum(held.values()) - 0.002  # rounded to 3 places
    assert written["checkpoint_save_seconds"] > 0  # the longest save's files, for the preemption window
    # Booked out of training into its own phase of the start and of the run's goodput record.
    booked = written["goodput"]["per_start"][-1]["phase_seconds"][goodput.CHECKPOINT]
    assert booked == pytest.approx(written["checkpoint_blocking_seconds"], abs=0.02)
    assert written["goodput"]["phase_seconds"][goodput.CHECKPOINT] == booked
    phases = list(written["phase_seconds"])  # in the order a start goes through them
    assert phases.index(goodput.CHECKPOINT) == phases.index(goodput.TRAINING) + 1


def test_goodput_names_checkpoint_saves_when_they_cost_the_most():
    start = {"initial_step": 0, "furthest_step": 400, "end": "finished"}
    phases = {"strategy": 1.0, "first execution": 5.0, "training": 70.0, "checkpoint": 20.0, "evaluation": 4.0}
    record = goodput.summarize([{**start, "phase_seconds": phases}])
    assert goodput.largest_loss(record) == (goodput.CHECKPOINT, pytest.approx(0.2))
    line = goodput.describe(record, 16)
    assert "largest loss: checkpoint 20%" in line and "train.async_checkpoint=true" in line
    assert record["productive_share"] == pytest.approx(0.7)


def checkpoint_values(path: str) -> dict:
    """The weights and optimizer state a checkpoint holds, by name."""
    reader = tf.train.load_checkpoint(path)
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if not name.startswith(("input/", "save_counter"))  # the cursor's JSON, the save count
    }


def with_random_draws() -> list[str]:
    """The task's augmentation and dropout on, where it has them: their random draws are saved with
    the checkpoint too (the dropout generators' state, copied with the weights)."""
    task = tasks.load(tasks.DEFAULT)
    data_keys = {field.name for field in dataclasses.fields(task.data_config)}
    model_keys = {field.name for field in dataclasses.fields(task.model_config)}
    return [
        *(["data.augment=true"] if "augment" in data_keys else []),
        *(["model.dropout=0.1"] if "dropout" in model_keys else []),
    ]


@pytest.mark.slow
def test_a_run_preempted_while_saving_in_the_background_resumes_to_the_uninterrupted_end(data_dir, tmp_path):
    """runtime.deterministic on 8 replicas (bfloat16 where the CPU computes it), augmentation and
    dropout on, a checkpoint in the background at every execution boundary: SIGTERM after step 11
    lands on a boundary whose save is being written; the start exits 143 with that checkpoint whole,
    the next start resumes from exactly that step, and its final weights, optimizer state and random
    generators' state equal an uninterrupted run's, bit for bit (batch norm's moving statistics,
    where the model has them, to float rounding: see test_train.py)."""
    overrides = [
        "train.async_checkpoint=true",
        "runtime.deterministic=true",
        "train.total_steps=24",
        "train.checkpoint_every=2",
        "train.steps_per_execution=2",
        "train.log_every=1",
        "train.eval_every=0",
        *with_random_draws(),
    ]
    env = {**os.environ, "PYTHONPATH": str(PROJECT / "src"), "PYTHONUNBUFFERED": "1"}
    straight = subprocess.run(
        train_command(data_dir, tmp_path / "straight", *overrides), capture_output=True, text=True, env=env, timeout=600
    )
    assert straight.returncode == 0, straight.stdout[-3000:] + straight.stderr[-3000:]

    command = train_command(data_dir, tmp_path / "stopped", *overrides)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    output = []
    for line in process.stdout:
        output.append(line)
        if line.startswith("step ") and int(line.split()[1].split("/")[0]) > 11:
            process.send_signal(signal.SIGTERM)
            break
    output += process.stdout.readlines()
    process.wait(timeout=120)
    text = "".join(output)
    assert process.returncode == train.PREEMPTED_EXIT_STATUS, text
    preempted = int(re.search(r"preempted \(SIGTERM\) at step (\d+)", text).group(1))
    assert 11 < preempted < 24 and preempted % 2 == 0
    # Its boundary's save was in the background; the preemption finished it and wrote the step once.
    saved = re.findall(r"checkpoint at step (\d+) (saving in the background|saved): training held [\d.]+ s", text)
    assert saved[-1] == (str(preempted), "saving in the background"), text
    assert [step for step, _ in saved].count(str(preempted)) == 1, text
    assert tf.train.latest_checkpoint(str(tmp_path / "stopped/checkpoints")).endswith(f"ckpt-{preempted}")

    finished = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    assert re.search(rf"resumed from step {preempted}\b", finished.stdout), finished.stdout[-3000:]
    assert "checkpoint saves held training" in finished.stdout

    want = checkpoint_values(str(tmp_path / "straight/checkpoints/ckpt-24"))
    got = checkpoint_values(str(tmp_path / "stopped/checkpoints/ckpt-24"))
    assert got.keys() == want.keys() and len(want) > 4
    statistics = [name for name in want if "/moving_mean/" in name or "/moving_variance/" in name]
    different = [name for name in want if name not in statistics and not np.array_equal(got[name], want[name])]
    assert not different, different[:5]
    for name in statistics:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    record = json.loads((tmp_path / "stopped/metrics.json").read_text())["goodput"]
    assert record["starts"] == 2 and record["repeated_steps"] == 0 and record["phase_seconds"][goodput.CHECKPOINT] > 0
