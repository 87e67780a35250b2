"""The task contract (task.py), checked for every task of this project on its own small sample with
its own test settings (`Task.testing`): what the shared core relies on, whatever the task learns.

A task added with `make new-task` is picked up here with nothing to register. The contract itself is
checked too: task.py's map names every member of `Task` and marks the abstract ones, and a task that
leaves one out is refused at load in one line.
"""

from __future__ import annotations

import ast
import inspect
import json
import math
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import PROJECT, config_file, finished_run_of, task_sample, task_config
from {{ cookiecutter.package }}.core import baselines, config, evaluation, input_pipeline, trainer
from {{ cookiecutter.package }} import predict, tasks
from {{ cookiecutter.package }}.core import task as task_lib
from {{ cookiecutter.package }}.core.errors import UserError
from {{ cookiecutter.package }}.core.task import RawExample, Task
from {{ cookiecutter.package }}.tasks.classification import ClassificationTask

TASKS = tasks.available()


@pytest.fixture(params=TASKS)
def task_name(request):
    """Each test runs once per task."""
    return request.param


@pytest.fixture
def sample(task_name, tmp_path_factory):
    return task_sample(task_name, tmp_path_factory)


@pytest.fixture
def contract_run(task_name, tmp_path_factory):
    return finished_run_of(task_name, tmp_path_factory)


def test_each_shipped_config_names_its_task(task_name):
    for which in ("local", "tpu", "pod"):
        loaded = config.load(str(config_file(task_name, which)), registry=tasks)
        assert loaded.task == task_name
        assert config.dump(loaded).startswith(f"task: {task_name}\n")


def test_parsed_batches_have_static_shapes_and_encoding_is_deterministic(task_name, sample, tmp_path):
    task = tasks.load(task_name)
    raw, data = sample
    manifest = input_pipeline.read_manifest(str(data), task)
    files, counts = input_pipeline.split_files(str(data), manifest, "train")
    features, targets = input_pipeline.train_pipeline(files, counts, task, manifest, 8, seed=0).element_spec
    for spec in tf.nest.flatten((features, targets)):  # what the TPU compiles for: one static shape
        assert spec.shape.is_fully_defined() and spec.shape[0] == 8
    # encode -> parse: the first readable raw examples, encoded twice, parse to the same tensors, of the
    # shapes the shards give, and the evaluation padding record parses to those shapes too.
    data_config = task_config(task_name, data, tmp_path).data
    listing = task.list_raw(str(raw))
    root = listing.root or str(raw)
    examples = []
    for unit in listing.units:
        with open(unit if unit.startswith("/") else f"{root}/{unit}", "rb") as handle:
            examples += [item for item in task.read_raw(unit, handle.read()) if isinstance(item, RawExample)]
        if len(examples) >= 4:
            break
    vocabularies = {field: sorted(counts) for field, counts in manifest["vocabularies"].items()}
    artifacts = {name: (data / name).read_bytes() for name in manifest["artifacts"]}
    records = [task.encode(example, data_config, vocabularies, artifacts)[0] for example in examples[:4]]
    assert records == [task.encode(example, data_config, vocabularies, artifacts)[0] for example in examples[:4]]
    parsed = task.parse_batch(tf.constant([*records, task.padding_record(manifest)]), manifest)
    expected = [spec.shape[1:] for spec in tf.nest.flatten((features, targets))]
    assert [tensor.shape[1:] for tensor in tf.nest.flatten(parsed)] == expected
    assert all(tensor.shape[0] == len(records) + 1 for tensor in tf.nest.flatten(parsed))


def test_broken_inputs_are_rejected_and_listed(task_name, sample):
    task = tasks.load(task_name)
    _, data = sample
    manifest = json.loads((data / "manifest.json").read_text())
    rejected = [json.loads(line) for line in (data / "rejected.jsonl").read_text().splitlines()]
    assert manifest["rejected"]["count"] == len(rejected) == task.testing().rejected
    assert all(entry["reason"] in task.reject_reasons and entry["source"] for entry in rejected)


def test_a_config_the_shards_do_not_fit_is_one_line(task_name, sample, tmp_path):
    _, data = sample
    task = tasks.load(task_name)
    cfg = task_config(task_name, data, tmp_path, task.testing().mismatch)
    with pytest.raises(UserError) as raised:
        input_pipeline.read_manifest(str(data), task, cfg.data)
    assert "\n" not in str(raised.value) and str(data) in str(raised.value)


def test_training_lowers_the_eval_loss_and_keeps_the_best_headline(contract_run):
    """The learning check any correct task passes: after 48 steps the eval loss (what every task
    minimises, over the whole eval split) is below the untrained model's, by at least a tenth of
    the way to zero. The headline metric is not required to improve this early: a thresholded one
    (F1 at 0.5 on tags) can start high and fall while the model learns the prior first. The margin
    is not chance: the run's initial weights, data order and shuffles are seeded, and the shipped
    tasks' eval losses fall to 0.33x-0.80x of the untrained ones here. Then the best periodic
    evaluation by the headline's direction."""
    cfg, output, metrics, initial = contract_run
    task = tasks.load(cfg.task)
    headline = task.headline_metric
    assert metrics["loss"] < 0.9 * initial["loss"], (initial, metrics)
    written = json.loads((output / "metrics.json").read_text())
    assert written["global_step"] == 48 and written[headline] == pytest.approx(metrics[headline])
    # The best periodic evaluation, by the task's direction, from the history as written.
    steps = {entry["step"]: entry[headline] for entry in written["history"]}
    assert sorted(steps) == [16, 32, 48]
    best_value = max(steps.values()) if task.higher_is_better else min(steps.values())
    assert written[f"best_{headline}"] == best_value and steps[written["best_step"]] == best_value
    assert (output / "checkpoints" / "best" / f"ckpt-{written['best_step']}.index").exists()


def test_preprocessing_scores_the_tasks_baselines_in_its_headline_metric(task_name, sample):
    """Every task declares at least one trivial baseline; the manifest keeps them, fitted on the train
    split and scored on the whole eval split of the small sample, in the headline metric."""
    task = tasks.load(task_name)
    manifest = json.loads((sample[1] / "manifest.json").read_text())
    found = manifest["baselines"]
    assert found["metric"] == task.headline_metric and found["higher_is_better"] == task.higher_is_better
    assert found["scores"] and all(math.isfinite(value) for value in found["scores"].values()), found
    assert found["train_records"] == manifest["splits"]["train"]["num_examples"]
    assert found["eval_records"] == manifest["splits"]["eval"]["num_examples"]


def test_a_run_reports_its_baselines_beside_its_evaluation(contract_run):
    """metrics.json keeps the baselines the run was judged against and whether it beat the best; the
    eval line names them with the verdict."""
    cfg, output, _, _ = contract_run
    task = tasks.load(cfg.task)
    manifest = json.loads((output / "export" / "assets.extra" / "manifest.json").read_text())
    written = json.loads((output / "metrics.json").read_text())
    found, value = manifest["baselines"], written[task.headline_metric]
    assert written["baselines"] == found["scores"]
    assert written["best_baseline"] == baselines.best(found)[0]
    beaten = (value >= baselines.best(found)[1]) if task.higher_is_better else (value <= baselines.best(found)[1])
    assert written["beats_best_baseline"] is beaten
    line = evaluation.describe(written, ["loss"], task, found)
    first = next(iter(found["scores"]))
    assert f"; baselines: {first} {found['scores'][first]:.4f}" in line
    assert line.endswith("(beaten)" if beaten else "(NOT beaten: see make doctor)")
    # The baselines in the task's other metrics, where it scores them (a token task's accuracy), beside
    # the model's own figure in metrics.json and in the line.
    others = found.get("other_metrics", {})
    assert written.get("baselines_other_metrics", {}) == others
    for metric, scores in others.items():
        assert metric in written and metric != task.headline_metric
        assert f"; {metric}: " + ", ".join(f"{name} {value:.4f}" for name, value in scores.items()) in line


def test_evaluation_counts_every_eval_example_once(contract_run):
    _, output, metrics, _ = contract_run
    manifest = json.loads((output / "export" / "assets.extra" / "manifest.json").read_text())
    assert metrics["eval_examples"] == manifest["splits"]["eval"]["num_examples"]


def test_a_tasks_split_metrics_come_from_one_pass_traced_once(task_name, sample, tmp_path, monkeypatch):
    """Task.split_metrics on 8 replicas: evaluation calls it once, with the model and the model's
    outputs and the targets of every eval example exactly once (the padding left out), and reports
    every name it returns (several numbers from one call) beside the streaming metrics; a training
    step's metrics leave them out. The same model on one device, over the same split, gives what it
    saw. A second evaluation of the model traces nothing again; a call that leaves out a declared
    name, or returns one not declared, is refused in one line that names them, with the fix for each."""
    from {{ cookiecutter.package }}.core import distribute
    from {{ cookiecutter.package }}.core.errors import UserError
    from {{ cookiecutter.package }}.core.model import build_model, compile_model, metric_names, step_metric_names

    task = tasks.load(task_name)
    _, data = sample
    cfg = task_config(task_name, data, tmp_path)
    manifest = input_pipeline.read_manifest(str(data), task, cfg.data)
    names, calls = ("split_examples", "split_mean_output"), []

    def split_metrics(model, outputs, targets, objective_config, manifest_):
        calls.append((model, outputs, targets, objective_config, manifest_))
        found = {"split_examples": float(len(tf.nest.flatten(targets)[0]))}
        return {**found, "split_mean_output": float(np.mean(tf.nest.flatten(outputs)[0]))}

    monkeypatch.setattr(task, "split_metric_names", names)
    monkeypatch.setattr(task, "split_metrics", split_metrics)
    assert metric_names(cfg, task, manifest)[-2:] == list(names)
    assert not set(names) & set(step_metric_names(cfg, task, manifest))
    resolved = distribute.resolve(cfg.runtime)
    with resolved.strategy.scope():
        model = compile_model(build_model(cfg, task, manifest), cfg, task, manifest, 1)
    traces, call = [], model.call

    def counted(*args, **kwargs):  # runs in Python only while a function calling the model is traced
        traces.append(1)
        return call(*args, **kwargs)

    model.call = counted
    metrics = evaluation.evaluate_model(model, resolved.strategy, cfg, task, manifest)
    [(seen_model, seen_outputs, seen_targets, seen_objective, seen_manifest)] = calls
    assert seen_model is model and seen_objective is cfg.objective and seen_manifest is manifest
    traced = len(traces)
    again = evaluation.evaluate_model(model, resolved.strategy, cfg, task, manifest)
    assert len(calls) == 2 and traced > 0 and len(traces) == traced  # the evaluation and the split pass: cached
    assert again["split_examples"] == metrics["split_examples"]
    del model.call

    files, counts = input_pipeline.split_files(str(data), manifest, "eval")
    outputs, targets = [], []
    for features, batch_targets, weights in input_pipeline.eval_pipeline(files, counts, task, manifest, 16):
        real = weights.numpy() > 0
        outputs.append(tf.nest.flatten(model(features, training=False))[0].numpy()[real])
        targets.append(tf.nest.flatten(batch_targets)[0].numpy()[real])
    outputs, targets = np.concatenate(outputs), np.concatenate(targets)

    def rows(array):
        return sorted(row.tobytes() for row in array.reshape(len(array), -1))

    assert metrics["split_examples"] == len(targets) == manifest["splits"]["eval"]["num_examples"]
    assert rows(tf.nest.flatten(seen_targets)[0]) == rows(targets)  # each example once, in any order
    assert metrics["split_mean_output"] == pytest.approx(float(np.mean(outputs)), rel=1e-4, abs=1e-6)

    monkeypatch.setattr(task, "split_metrics", lambda *args: {"split_examples": 1.0})
    declared = r"its split_metric_names are \['split_examples', 'split_mean_output'\]: "
    missing = r"return \['split_mean_output'\] too, or drop them from split_metric_names"
    refused = rf"^the task's split_metrics returned \['split_examples'\], {declared}{missing}$"
    with pytest.raises(UserError, match=refused):
        evaluation.evaluate_model(model, resolved.strategy, cfg, task, manifest)
    # A name it does not declare, alone and beside a missing one: each with its own advice.
    unexpected = r"declare \['split_recall'\] in split_metric_names"
    for returned, advice in (
        ({"split_examples": 1.0, "split_mean_output": 0.5, "split_recall": 0.9}, unexpected),
        ({"split_examples": 1.0, "split_recall": 0.9}, f"{missing}; {unexpected}"),
    ):
        monkeypatch.setattr(task, "split_metrics", lambda *args, returned=returned: returned)
        shown = re.escape(str(list(returned)))
        with pytest.raises(UserError, match=rf"^the task's split_metrics returned {shown}, {declared}{advice}$"):
            evaluation.split_metrics(model, seen_outputs, seen_targets, cfg, task, manifest)


def test_a_rerun_of_a_finished_run_only_evaluates_the_same(contract_run, capsys, tmp_path):
    """Reruns a copy of the shared run: the run itself stays as trained for every other reader."""
    cfg, shared, metrics, _ = contract_run
    task = tasks.load(cfg.task)
    output = tmp_path / "run"
    shutil.copytree(shared, output)
    again = trainer.train(
        config.load(
            str(output / "config.yaml"),
            ["train.steps_per_execution=auto", f"runtime.output_dir={output}"],
            registry=tasks,
        ),
        task,
    )
    printed = capsys.readouterr().out
    assert "resumed from step 48" in printed and "calibrating" not in printed
    assert config.load(str(output / "config.yaml"), registry=tasks).train.steps_per_execution == 4  # left as trained
    assert again["global_step"] == 48
    assert again[task.headline_metric] == pytest.approx(metrics[task.headline_metric], rel=1e-5)
    # metrics.json stays strict JSON with the history as trained (the last evaluation not repeated).
    written = json.loads((output / "metrics.json").read_text(), parse_constant=lambda name: pytest.fail(name))
    assert [entry["step"] for entry in written["history"]] == [16, 32, 48]
    assert written["examples_per_second"] == pytest.approx(metrics["examples_per_second"])


def test_the_export_alone_predicts(contract_run, sample, tmp_path, monkeypatch):
    """`make predict` from a copy of the export alone; the task's `predictions` is given the batch its
    `predict_inputs` returned, beside the served outputs."""
    cfg, output, _, _ = contract_run
    task = tasks.load(cfg.task)
    raw, _ = sample
    moved = tmp_path / "elsewhere"
    shutil.copytree(output / "export", moved / "export")  # no data folder, no checkpoints
    inputs = task.testing().predict_inputs(raw, tmp_path)
    read, formatted, batches, given = task.predict_inputs, task.predictions, [], []
    monkeypatch.setattr(task, "predict_inputs", lambda *args: batches.append(read(*args)) or batches[-1])
    monkeypatch.setattr(task, "predictions", lambda *args: given.append(args) or formatted(*args))
    rows = predict.predict(str(moved), inputs)
    [(names, batch)] = batches
    [(inputs_given, outputs, manifest, export_dir)] = given
    assert inputs_given is batch and export_dir == str(moved / "export") and manifest["task"] == task.name
    assert [name for name, _ in rows] == names and len(tf.nest.flatten(outputs)[0]) == len(names)
    assert rows and all(fields for _, fields in rows)
    lines = [predict.line(name, fields) for name, fields in rows]
    assert all(line.endswith(name) and line.count("\t") == len(fields) for line, (name, fields) in zip(lines, rows))

    # Served one at a time: the same predictions, in as many calls as there are examples.
    monkeypatch.undo()
    assert len(names) >= 2, "the task's testing inputs are too few to be served in parts"
    load, calls = predict.load_export, []

    def counted_export(run_dir):
        serve, *rest = load(run_dir)
        return (lambda *args, **kwargs: calls.append(1) or serve(*args, **kwargs)), *rest

    monkeypatch.setattr(predict, "load_export", counted_export)
    parts = predict.predict(str(moved), inputs, batch_size=1)
    assert len(calls) == len(names)
    assert [name for name, _ in parts] == names
    for (_, whole), (_, part) in zip(rows, parts):
        assert list(whole) == list(part)
        for key in whole:
            assert part[key] == (pytest.approx(whole[key], rel=1e-4) if isinstance(whole[key], float) else whole[key])

    # Out of device memory serving them: one line with how many went at once, and fewer.
    def exhausted_export(run_dir):
        _, *rest = load(run_dir)

        def serve(*args, **kwargs):
            raise tf.errors.ResourceExhaustedError(None, None, "Ran out of memory in memory space hbm")

        return serve, *rest

    monkeypatch.setattr(predict, "load_export", exhausted_export)
    with pytest.raises(UserError) as raised:
        predict.main(["--run", str(moved), "--batch", "8", *inputs])
    served = min(8, len(names))
    assert str(raised.value) == (
        f"out of device memory serving {served} examples at once (Ran out of memory in memory space hbm); serve "
        f"fewer at a time: make predict PREDICT_BATCH={max(1, served // 4)} (python -m {predict.__package__}.predict "
        f"--batch {max(1, served // 4)})"
    )


# The classifiers (tasks/classification.py): only they serve a class and its probability. A project
# without one collects no such test (nothing to skip); a classifier added later brings it back.
CLASSIFIERS = [name for name in TASKS if isinstance(tasks.load(name), ClassificationTask)]


@pytest.mark.parametrize("task_name", CLASSIFIERS)
def test_a_classifier_prints_the_likeliest_class_of_the_probabilities_it_serves(contract_run, sample, tmp_path):
    """A classifier: for every eval example, the export's probabilities are the softmax of
    the trained model's logits (restored from the checkpoint, not from the export), and what `make
    predict` prints is the class they rank first with its probability; so predict's labels score
    the accuracy the run's final evaluation reported."""
    from {{ cookiecutter.package }}.core import model as model_lib
    from {{ cookiecutter.package }}.core import precision
    from {{ cookiecutter.package }}.core.keras import keras

    cfg, output, metrics, _ = contract_run
    task = tasks.load(cfg.task)
    raw, data = sample
    serve, manifest, export_dir = predict.load_export(str(output))
    files, _ = input_pipeline.split_files(str(data), manifest, "eval")
    records = [record for record in tf.data.TFRecordDataset(files)]
    features, labels = task.parse_batch(tf.stack(records), manifest)
    served = {key: value.numpy() for key, value in serve(features).items()}
    probabilities = served["probabilities"]
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)

    policy = keras.mixed_precision.global_policy()
    precision.set_policy("bfloat16")  # as trained
    try:
        model = model_lib.build_model(cfg, task, manifest)
    finally:
        keras.mixed_precision.set_global_policy(policy)
    tf.train.Checkpoint(model=model).restore(tf.train.latest_checkpoint(str(output / "checkpoints"))).expect_partial()
    logits = tf.cast(model(features, training=False), tf.float32)
    np.testing.assert_allclose(probabilities, tf.nn.softmax(logits).numpy(), atol=2e-2)

    printed = task.predictions(
        tf.nest.map_structure(lambda tensor: tensor.numpy(), features), served, manifest, export_dir
    )
    likeliest = probabilities.argmax(axis=1)
    assert [row["label"] for row in printed] == [manifest["label_names"][index] for index in likeliest]
    assert [row["probability"] for row in printed] == pytest.approx(probabilities.max(axis=1).tolist(), rel=1e-6)
    right = sum(row["label"] == manifest["label_names"][label] for row, label in zip(printed, labels.numpy()))
    assert abs(right - metrics[task.headline_metric] * len(records)) <= 1, (right, len(records), metrics)

    # The same through predict's own reading of INPUT files, as `make predict` runs it.
    inputs = task.testing().predict_inputs(raw, tmp_path)
    names, batch = task.predict_inputs(inputs, manifest, export_dir)
    expected = serve(tf.constant(batch))["probabilities"].numpy()
    rows = predict.predict(str(output), inputs)
    assert [name for name, _ in rows] == names
    assert [fields["label"] for _, fields in rows] == [manifest["label_names"][i] for i in expected.argmax(axis=1)]


if not CLASSIFIERS:  # an empty parametrization would be reported as a skip
    del test_a_classifier_prints_the_likeliest_class_of_the_probabilities_it_serves


# The tasks whose objective has `objective.label_smoothing` (the classifiers' shared objective).
SMOOTHING = [name for name in TASKS if hasattr(tasks.load(name).objective_config(), "label_smoothing")]


@pytest.mark.parametrize("task_name", SMOOTHING)
def test_label_smoothing_is_cross_entropy_against_smoothed_targets(task_name):
    """`objective.label_smoothing=e` reaches the loss: per example, the cross-entropy of the logits
    against (1 - e) one-hot + e / classes; 0 is the plain cross-entropy of the target's class."""
    logits = np.array([[2.0, 0.5, -1.0, 0.0], [0.1, 0.2, 0.3, 0.4]], np.float32)
    targets = np.array([0, 3])
    log_softmax = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    one_hot = np.eye(4)[targets]
    manifest = {"num_classes": 4, "label_names": list("abcd")}
    task = tasks.load(task_name)
    for smoothing in (0.0, 0.1):
        cfg = config.load(str(config_file(task_name)), [f"objective.label_smoothing={smoothing}"], registry=tasks)
        per_example = task.build_loss(cfg.objective, manifest).call(tf.constant(targets), tf.constant(logits))
        smoothed = (1 - smoothing) * one_hot + smoothing / 4
        np.testing.assert_allclose(per_example.numpy(), -(smoothed * log_softmax).sum(axis=1), rtol=1e-5)
    with pytest.raises(UserError, match=r"objective.label_smoothing must be in \[0, 1\), got 1.0"):
        config.load(str(config_file(task_name)), ["objective.label_smoothing=1.0"], registry=tasks)


if not SMOOTHING:  # an empty parametrization would be reported as a skip
    del test_label_smoothing_is_cross_entropy_against_smoothed_targets


# ----------------------------------------------------------------------------- the contract itself


def contract_map() -> dict[str, bool]:
    """The members task.py's docstring maps, each with whether it is marked required (*)."""
    members = {}
    for line in task_lib.__doc__.splitlines():
        # "    <group>  <member>[*], ...", or a continuation line indented to the members' column
        row = re.fullmatch(r"    (?:\S.*?  +| {13})(\w[\w*, ]*)", line)
        if row:
            members.update({name: bool(star) for name, star in re.findall(r"(\w+)(\*?)", row.group(1))})
    return members


def test_the_map_names_every_member_and_the_required_ones_are_abstract():
    documented = contract_map()
    # Every member, in the order Task defines them (its body follows the map).
    assert list(documented) == [name for name in vars(Task) if not name.startswith("_")]
    # `build_loss` is required unless a task has a build_step_loss: Task.__new__ enforces it, not ABC.
    assert {name for name, required in documented.items() if required} == {*Task.__abstractmethods__, "build_loss"}
    for name in TASKS:  # derived from whether `fit_encoding` is overridden: no task may set it
        assert isinstance(inspect.getattr_static(tasks.load(name), "needs_encoding_fit"), property), name


def task_package(tmp_path, monkeypatch, name: str, source: str):
    """A task package `name` whose task.py is `source`, found by tasks.load like any other (a folder on
    the tasks package's search path, for this test only); returns its folder."""
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("from .task import TASK  # noqa: F401\n")
    (package / "task.py").write_text(source)
    monkeypatch.setattr(tasks, "__path__", [*tasks.__path__, str(tmp_path)])
    for module in (f"{tasks.__name__}.{name}", f"{tasks.__name__}.{name}.task"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    return package


UNFINISHED = """
from ...core.task import Task


class Unfinished(Task):
    name = "unfinished"
    raw_format = "anything"

    def list_raw(self, input_root):
        return None


TASK = Unfinished()
"""


def test_a_task_missing_required_members_fails_at_load_in_one_line(tmp_path, monkeypatch):
    """A task package found like any other (a folder under tasks/, here on the package's search path
    for this test only) that leaves members out: loading it is one UserError naming them and its file."""
    package = task_package(tmp_path, monkeypatch, "unfinished", UNFINISHED)
    with pytest.raises(UserError) as raised:
        tasks.load("unfinished")
    message = str(raised.value)
    missing = [
        name for name, required in contract_map().items() if required and name not in ("name", "raw_format", "list_raw")
    ]
    assert message == (
        f"task 'unfinished' ({package / 'task.py'}) does not implement {', '.join(missing)}; see Task in "
        f"src/{tasks.__name__.split('.')[0]}/core/task.py for what each must return"
    )
    # No TASK at all: one line too.
    (package / "__init__.py").write_text("")
    with pytest.raises(UserError, match=r"^task 'unfinished' \(.*__init__.py\) has no TASK: "):
        tasks.load("unfinished")


OUTDATED = """
from ...core.task import Task


class Outdated(Task):
    name = "outdated"
    raw_format = "anything"

    def metrics(self, objective_config, manifest):
        return []


TASK = Outdated()
"""


def test_a_task_written_to_the_first_edition_fails_at_load_in_one_line(tmp_path, monkeypatch):
    """A task package that defines `metrics`, the first edition's name of `build_metrics`, which the core
    would silently never call: loading it is one UserError naming the old member, the new one with its
    parameters, and the task's file (before the members it then lacks)."""
    package = task_package(tmp_path, monkeypatch, "outdated", OUTDATED)
    with pytest.raises(UserError) as raised:
        tasks.load("outdated")
    assert str(raised.value) == (
        f"task 'outdated' ({package / 'task.py'}) defines members the core no longer calls: metrics is now "
        f"build_metrics(objective_config, manifest); see Task in src/{tasks.__name__.split('.')[0]}/core/task.py "
        "for what each must return"
    )


WITHOUT_SEED = """
from ...core.task import Task


class WithoutSeed(Task):
    name = "without_seed"
    raw_format = "anything"

    def parse_batch(self, serialized, manifest, training=False):
        return serialized, serialized


TASK = WithoutSeed()
"""


def test_a_parse_batch_without_the_seed_fails_at_load_in_one_line(tmp_path, monkeypatch):
    """A task whose parse_batch takes no `seed` and no `data_config` (written before the train input
    passed each batch its random key and the run's data section) would fail at the first batch, inside
    tf.data: loading it is one UserError naming the member, the parameters it lacks, what it must look
    like and the task's file; one that lacks only `data_config` is named for that one. One that takes
    **kwargs is not refused."""
    package = task_package(tmp_path, monkeypatch, "without_seed", WITHOUT_SEED)
    with pytest.raises(UserError) as raised:
        tasks.load("without_seed")
    looks = (
        "passes it: make it parse_batch(serialized, manifest, training=False, seed=None, data_config=None), drawing "
        "any augmentation from seed with tf.random.stateless_* ops and reading the run's data keys from "
        f"data_config; see Task in src/{tasks.__name__.split('.')[0]}/core/task.py for what each must return"
    )
    assert str(raised.value) == (
        f"task 'without_seed' ({package / 'task.py'}) defines parse_batch without the seed and data_config "
        f"parameters the core {looks}"
    )
    package = task_package(
        tmp_path,
        monkeypatch,
        "without_config",
        WITHOUT_SEED.replace("training=False)", "training=False, seed=None)").replace("without_seed", "without_config"),
    )
    with pytest.raises(UserError) as raised:
        tasks.load("without_config")
    assert str(raised.value) == (
        f"task 'without_config' ({package / 'task.py'}) defines parse_batch without the data_config parameter the "
        f"core {looks}"
    )
    with_options = type("WithOptions", (Task,), {"parse_batch": lambda self, serialized, manifest, **options: None})
    with pytest.raises(task_lib.IncompleteTask) as incomplete:  # the members it lacks, nothing else
        with_options()
    assert not isinstance(incomplete.value, task_lib.OutdatedTask)


def test_every_first_edition_member_is_refused_with_what_it_became():
    """Each renamed member of the first edition, defined by a task (or by a class it inherits from), is
    refused with its new name and parameters; a first-edition task is told too of the members it
    defines whose parameters changed order. A `split_metrics` without `split_metric_names` would never
    be called: refused; with them it is not."""
    renamed = {
        "fit": "fit_encoding(train_payloads, data_config, workdir)",
        "fit_sample_size": "encoding_sample_size(data_config)",
        "categorical_targets": "vocabularies(example)",
        "loss": "build_loss(objective_config, manifest)",
        "step_loss": "build_step_loss(objective_config, manifest), whose function takes the model first",
        "metrics": "build_metrics(objective_config, manifest)",
        "callbacks": "build_callbacks(cfg, output_dir)",
        "baselines": "score_baselines(train, evaluation, manifest)",
        "serving_signature": "build_serving_signature(model, predict_config, objective_config, manifest)",
    }
    for old, new in renamed.items():
        member = True if old == "categorical_targets" else lambda self, *args: None
        base = type("Base", (Task,), {old: member, "__module__": __name__})
        with pytest.raises(task_lib.OutdatedTask) as raised:
            type("Old", (base,), {"__module__": tasks.__name__})()  # in another file than the member
        assert f" {old} is now {new}" in str(raised.value) and "\n" not in str(raised.value), old
        assert raised.value.missing == [new.split("(")[0]] and new.split("(")[0] in vars(Task)
        assert raised.value.task_file == __file__

    class FirstEdition(Task):
        categorical_targets = True

        def encode(self, example, categories, data_config, artifacts):
            return b"", {}

        def serving_signature(self, model, manifest, predict_config, objective_config):
            return None

        def predictions(self, outputs, export_dir, manifest):
            return []

    with pytest.raises(task_lib.OutdatedTask) as raised:
        FirstEdition()
    assert raised.value.problem == (
        "defines members the core no longer calls: categorical_targets is now vocabularies(example), the "
        "category names the example holds by field (e.g. {'label': [example.target]}); serving_signature is "
        "now build_serving_signature(model, predict_config, objective_config, manifest); these keep their "
        "names, with their parameters now in this order: encode(example, data_config, vocabularies, "
        "artifacts), predictions(inputs, outputs, manifest, export_dir)"
    )

    class Unnamed(Task):
        def split_metrics(self, model, outputs, targets, objective_config, manifest):
            return {"recall": 1.0}

    with pytest.raises(task_lib.OutdatedTask, match=r"split_metrics is never called while split_metric_names is "):
        Unnamed()
    Unnamed.split_metric_names = ("recall",)
    with pytest.raises(task_lib.IncompleteTask) as raised:  # the required members it lacks: nothing else
        Unnamed()
    assert not isinstance(raised.value, task_lib.OutdatedTask)


@pytest.mark.parametrize(
    "imported, expected",
    [
        (
            "from ..shared_code import reader",
            r"imports {package}\.tasks\.shared_code, which this project does not "
            r"have .*text/ and classification.py\); check the import's spelling, or add the module at "
            r"src/{package}/tasks/shared_code\.py$",
        ),
        (
            "import a_distribution_not_installed",
            r"imports a_distribution_not_installed, which is not installed; "
            r"add its distribution to requirements.txt and run `make setup`$",
        ),
    ],
)
def test_a_task_importing_a_missing_module_fails_at_load_in_one_line(tmp_path, monkeypatch, imported, expected):
    """A task importing shared code this project does not have (every bake keeps tasks/text/ and
    classification.py), or one that needs a distribution not installed: one UserError naming the
    module and the fix."""
    package = tmp_path / "copied"
    package.mkdir()
    (package / "__init__.py").write_text(f"{imported}  # noqa: F401\nfrom .task import TASK  # noqa: F401\n")
    (package / "task.py").write_text(UNFINISHED)
    monkeypatch.setattr(tasks, "__path__", [*tasks.__path__, str(tmp_path)])
    monkeypatch.delitem(sys.modules, f"{tasks.__name__}.copied", raising=False)
    pattern = expected.format(package=tasks.__name__.split(".")[0])
    with pytest.raises(UserError, match=rf"^task 'copied' {pattern}") as raised:
        tasks.load("copied")
    assert "\n" not in str(raised.value)


def test_make_train_stops_at_once_on_a_task_missing_a_member(tmp_path):
    """The project's own task with `build_model` deleted, run as `make train` runs it: the one line
    is all it prints, with the file relative to the project."""
    shutil.copytree(PROJECT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(PROJECT / "configs", tmp_path / "configs")
    package = tasks.__name__.split(".")[0]
    task_py = tmp_path / "src" / package / "tasks" / tasks.DEFAULT / "task.py"
    source = task_py.read_text()
    [method] = [
        node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef) and node.name == "build_model"
    ]
    lines = source.splitlines(keepends=True)
    task_py.write_text("".join(lines[: method.lineno - 1] + lines[method.end_lineno :]))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src"), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-m", f"{package}.train", "--config", "configs/local.yaml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"error: task '{tasks.DEFAULT}' (src/{package}/tasks/{tasks.DEFAULT}/task.py) does not implement "
        f"build_model; see Task in src/{package}/core/task.py for what each must return\n"
    )
