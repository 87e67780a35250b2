"""A new run from another run's weights (train.init_from, train.init_skip) and frozen layers
(train.freeze), on the project's own task: the source is the suite's shared short run."""

import json

import numpy as np
import pytest
import tensorflow as tf

from conftest import finished_run_of, tiny_config
from {{ cookiecutter.package }} import tasks
from {{ cookiecutter.package }}.core import config, input_pipeline, memory, trainer, warm_start
from {{ cookiecutter.package }}.core.errors import UserError
from {{ cookiecutter.package }}.core.keras import keras
from {{ cookiecutter.package }}.core.model import build_model


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """The shared short run (conftest.finished_run_of), the source every test here starts from."""
    cfg, output, _, _ = finished_run_of(tasks.DEFAULT, tmp_path_factory)
    return cfg, output


def source_values(checkpoint: str) -> dict:
    """path -> value of every model weight of a checkpoint, read without the project's code: each
    weight's full name as the checkpoint's object graph records it."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    reader = tf.train.load_checkpoint(checkpoint)
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    return {
        attribute.full_name: reader.get_tensor(attribute.checkpoint_key)
        for node in graph.nodes
        for attribute in node.attributes
        if attribute.checkpoint_key.startswith("model/layer")
    }


def model_of(cfg):
    task = tasks.load(cfg.task)
    return build_model(cfg, task, input_pipeline.read_manifest(cfg.data.dir, task, cfg.data))


def last_layer(model) -> str:
    """The layer of the model's last weight (its head; a tied head's own weight is the embedding's)."""
    return warm_start.weight_path(model.weights[-1]).split("/")[0]


def test_a_run_directory_a_checkpoints_folder_and_a_checkpoint_name_the_same_weights(finished_run, tmp_path):
    _, output = finished_run
    newest = tf.train.latest_checkpoint(str(output / "checkpoints"))
    assert warm_start.checkpoint_of(str(output)) == newest
    assert warm_start.checkpoint_of(str(output / "checkpoints")) == newest
    best = tf.train.latest_checkpoint(str(output / "checkpoints" / "best"))
    assert warm_start.checkpoint_of(str(output / "checkpoints" / "best")) == best != newest
    older = sorted(tf.train.get_checkpoint_state(str(output / "checkpoints")).all_model_checkpoint_paths)[0]
    assert warm_start.checkpoint_of(older) == older != newest
    assert warm_start.checkpoint_of(str(output / "export")) == f"{output / 'export'}/variables/variables"
    with pytest.raises(UserError, match=f"train.init_from={tmp_path} holds no checkpoint; give a run directory"):
        warm_start.checkpoint_of(str(tmp_path))


def test_an_export_gives_the_weights_of_the_runs_last_checkpoint(finished_run):
    """A run's export (a SavedModel) as the source: the same weights, by the same paths, as the
    checkpoint the run ended with, and none of the optimizer's."""
    cfg, output = finished_run
    exported, saved = warm_start.Source.read(str(output / "export")), warm_start.Source.read(str(output))
    assert exported.keys.keys() == saved.keys.keys() and exported.shapes == saved.shapes and exported.step == 48
    assert not any(key.startswith(("optimizer/", "keras_api/")) for key in exported.keys.values())
    model = model_of(cfg)
    warm_start.load(model, str(output / "export"), [])
    want = source_values(saved.checkpoint)
    for variable in model.weights:
        path = warm_start.weight_path(variable)
        np.testing.assert_array_equal(variable.numpy(), want[path], err_msg=path)


def test_the_loaded_weights_are_the_sources_and_the_skipped_ones_stay_as_initialised(finished_run, tmp_path):
    cfg, output = finished_run
    model = model_of(cfg)
    initial = {warm_start.weight_path(variable): variable.numpy() for variable in model.weights}
    head = last_layer(model)
    source, found = warm_start.load(model, str(output), [head])
    want = source_values(source.checkpoint)
    assert source.step == 48 and source.checkpoint.endswith("ckpt-48")
    assert len(found.loaded) + len(found.skipped) == len(model.weights) and not found.new
    assert found.skipped and all(path.startswith(f"{head}/") for path, _, _ in found.skipped)
    for variable in model.weights:
        path = warm_start.weight_path(variable)
        if path.startswith(f"{head}/"):
            np.testing.assert_array_equal(variable.numpy(), initial[path], err_msg=path)
        else:
            np.testing.assert_array_equal(variable.numpy(), want[path], err_msg=path)
            assert not np.array_equal(want[path], initial[path]) or want[path].std() == 0, path
    described = found.describe(source)
    assert f"{len(found.loaded)} weights loaded" in described and f"skipped: {found.skipped[0][0]}" in described
    summary = found.summary(source, str(output))
    assert (
        summary["loaded"] == len(found.loaded)
        and summary["step"] == 48
        and len(summary["skipped"]) == len(found.skipped)
    )


def test_a_weight_of_another_shape_is_one_line_unless_skipped(finished_run):
    cfg, output = finished_run
    model = model_of(cfg)
    source = warm_start.Source.read(str(output))
    variable = model.weights[-1]
    path = warm_start.weight_path(variable)
    wrong = tuple(variable.shape[:-1]) + (int(variable.shape[-1]) + 1,)
    other = warm_start.Source(source.checkpoint, source.keys, {**source.shapes, path: wrong}, source.step)
    with pytest.raises(UserError) as raised:
        warm_start.match(model, other, [])
    message = str(raised.value)
    assert "\n" not in message and path in message and str(list(wrong)) in message
    assert str(list(variable.shape)) in message and f"train.init_skip=[{path.split('/')[0]}]" in message
    assert warm_start.match(model, other, [path.split("/")[0]]).skipped[-1] == (path, tuple(variable.shape), wrong)
    # A weight the source does not hold is new, not an error.
    fewer = warm_start.Source(source.checkpoint, source.keys, {k: v for k, v in source.shapes.items() if k != path}, 0)
    assert warm_start.match(model, fewer, []).new == [(path, tuple(variable.shape))]
    with pytest.raises(UserError, match="train.init_skip: 'no_such_layer' names no weight of this model"):
        warm_start.match(model, source, ["no_such_layer"])


def test_patterns_name_a_layer_or_a_weight():
    assert warm_start.matches("logits/kernel", ["logits"]) == "logits"
    assert warm_start.matches("block0_mlp_in/kernel", ["block*"]) == "block*"
    assert warm_start.matches("block0_mlp_in/bias", ["*/kernel"]) is None
    assert warm_start.matches("logits_extra/kernel", ["logits"]) is None
    assert warm_start.matches("a/b/kernel", ["a/b"]) == "a/b"


def test_a_fine_tune_starts_from_the_source_and_a_resume_never_reads_it_again(finished_run, data_dir, tmp_path, capsys):
    """The first start loads the source (the log and metrics.json say what it loaded); a second
    start of the same run resumes its own checkpoint even when the source is gone."""
    import shutil

    _, output = finished_run
    source = tmp_path / "source"
    shutil.copytree(output / "checkpoints", source / "checkpoints")
    run = tmp_path / "fine-tune"
    first = tiny_config(data_dir, run, f"train.init_from={source}", "train.total_steps=4", "train.checkpoint_every=4")
    trainer.train(first, tasks.load(first.task))
    said = capsys.readouterr().out
    assert f"initialised from {source}/checkpoints/ckpt-48 at step 48: " in said
    record = json.loads((run / "metrics.json").read_text())["initialised_from"]
    assert record["step"] == 48 and record["loaded"] == len(model_of(first).weights) and not record["new"]

    shutil.rmtree(source)
    again = tiny_config(data_dir, run, f"train.init_from={source}", "train.total_steps=8", "train.checkpoint_every=4")
    trainer.train(again, tasks.load(again.task))
    said = capsys.readouterr().out
    assert "train.init_from not read: this run resumes its own checkpoint" in said and "initialised from" not in said
    assert json.loads((run / "metrics.json").read_text())["initialised_from"] == record


def test_frozen_layers_keep_their_weights_and_get_no_gradient_slot_or_plan(finished_run, data_dir, tmp_path, capsys):
    """train.freeze on the first layer with weights (and every batch normalisation, where the model
    has one: its moving statistics too): after training from the source, their weights are the
    source's bit for bit and the others moved; the optimizer holds no slot for them; the memory plan
    leaves their gradients and slots out, by exactly their size."""
    _, output = finished_run
    probe = model_of(tiny_config(data_dir, tmp_path / "probe"))
    with_weights = [layer for layer in probe._flatten_layers(include_self=False) if layer.weights]
    frozen_names = sorted(
        {with_weights[0].name}
        | {layer.name for layer in with_weights if isinstance(layer, keras.layers.BatchNormalization)}
    )
    freeze = f"train.freeze=[{', '.join(frozen_names)}]"
    run = tmp_path / "frozen"
    cfg = tiny_config(data_dir, run, f"train.init_from={output}", freeze, "train.total_steps=4")
    trainer.train(cfg, tasks.load(cfg.task))
    said = capsys.readouterr().out
    model = model_of(cfg)
    frozen = {
        warm_start.weight_path(variable)
        for layer in model._flatten_layers(include_self=False)
        if layer.name in frozen_names
        for variable in layer.weights
    }
    trained = sum(int(np.prod(variable.shape)) for variable in model.trainable_weights)
    assert f"{trained:,} of " in said and "parameters train (train.freeze: " in said
    before, after = (
        source_values(str(output / "checkpoints" / "ckpt-48")),
        source_values(str(run / "checkpoints" / "ckpt-4")),
    )
    # Batch norm's moving statistics are kept per replica and saved as their mean, which rounds in the
    # last place (up to 1.2e-7 measured); in training mode 4 steps would move them by percents.
    statistics = {path for path in frozen if "/moving_" in path}
    assert frozen and all(np.array_equal(after[path], before[path]) for path in frozen - statistics)
    for path in statistics:
        np.testing.assert_allclose(after[path], before[path], rtol=1e-6, atol=1e-6, err_msg=path)
    assert any(not np.array_equal(after[path], before[path]) for path in after if path not in frozen)
    slots = [
        name
        for name in tf.train.list_variables(str(run / "checkpoints" / "ckpt-4"))
        if "optimizer/_variables" in name[0]
    ]
    moments = {"adamw": 2, "sgd": 1, "adafactor": 0}[cfg.train.optimizer]
    if moments:
        assert (
            len(slots)
            == moments * len(model.trainable_weights)
            < moments * len([v for v in probe.weights if v.trainable])
        )

    task = tasks.load(cfg.task)
    manifest = input_pipeline.read_manifest(cfg.data.dir, task, cfg.data)
    plan = memory.Planner(cfg, task, manifest).plan(4, 2**34, precision_name="float32")
    whole = memory.Planner(tiny_config(data_dir, tmp_path / "whole"), task, manifest).plan(
        4, 2**34, precision_name="float32"
    )
    frozen_trainable = sum(
        int(np.prod(variable.shape))
        for variable in probe.trainable_weights
        if warm_start.weight_path(variable) in frozen
    )
    assert frozen_trainable > 0 and whole.gradients - plan.gradients == 4 * frozen_trainable
    assert plan.weights == whole.weights and plan.optimizer_slots < whole.optimizer_slots


def test_a_freeze_pattern_that_names_no_layer_is_one_line(data_dir, tmp_path):
    cfg = tiny_config(data_dir, tmp_path, "train.freeze=[no_such_layer]")
    with pytest.raises(UserError, match="train.freeze: 'no_such_layer' names no layer with weights in this model"):
        model_of(cfg)


def test_init_skip_without_init_from_is_refused(data_dir, tmp_path):
    with pytest.raises(config.ConfigError, match="train.init_skip names weights to leave out of train.init_from"):
        tiny_config(data_dir, tmp_path, "train.init_skip=[logits]")


def test_a_source_with_another_tokenizer_is_refused_in_one_line(tmp_path):
    """The source run's export keeps its data manifest: a tokenizer other than the data's is refused
    (the same ids would mean other pieces); the same one is said; without an export, or for data
    without a tokenizer, nothing is refused."""
    run = tmp_path / "pretrain"
    extra = run / "export" / "assets.extra"
    extra.mkdir(parents=True)
    (extra / "manifest.json").write_text(json.dumps({"tokenizer": {"sha256": "a" * 64}}))
    for folder in ("checkpoints", "checkpoints/best"):
        source = warm_start.Source(str(run / folder / "ckpt-6"), {}, {}, 6)
        assert warm_start.check_vocabulary(source, {"tokenizer": {"sha256": "a" * 64}}).startswith(
            "the same tokenizer as the source run (sha256 aaaaaaaaaaaa)"
        )
        with pytest.raises(UserError) as raised:
            warm_start.check_vocabulary(source, {"tokenizer": {"sha256": "b" * 64}})
        message = str(raised.value)
        assert "\n" not in message and "aaaaaaaaaaaa" in message and "bbbbbbbbbbbb" in message
        assert f"preprocess with data.tokenizer={run} to share it" in message
        assert warm_start.check_vocabulary(source, {}) == ""
    export = warm_start.Source(str(run / "export" / "variables" / "variables"), {}, {}, 6)
    assert warm_start.check_vocabulary(export, {"tokenizer": {"sha256": "a" * 64}}).startswith("the same tokenizer")
    with pytest.raises(UserError, match=f"preprocess with data.tokenizer={run / 'export'} to share it"):
        warm_start.check_vocabulary(export, {"tokenizer": {"sha256": "b" * 64}})
    unexported = warm_start.Source(str(tmp_path / "other" / "checkpoints" / "ckpt-6"), {}, {}, 6)
    assert "not checked (it has no export)" in warm_start.check_vocabulary(unexported, {"tokenizer": {"sha256": "b"}})
    assert warm_start.run_of(str(tmp_path / "loose" / "ckpt-1")) is None


def test_the_doctor_checks_the_source_before_the_run(finished_run, data_dir, tmp_path):
    """model.init_from: the source's weights against the config's model and its tokenizer against the
    data's, before any TPU hour: PASS with the counts, FAIL with the one line training would give."""
    from conftest import MODEL_OVERRIDES
    from test_doctor import check

    from {{ cookiecutter.package }}.doctor import engine

    _, output = finished_run
    same = check(data_dir, *MODEL_OVERRIDES, f"train.init_from={output}", tmp_path=tmp_path)["model.init_from"]
    model = model_of(tiny_config(data_dir, tmp_path / "probe"))
    assert same.status == engine.PASS, same.message
    assert f"ckpt-48 at step 48: {len(model.weights)} weights to load, 0 new, 0 skipped" in same.message
    head = last_layer(model)
    skipped = check(
        data_dir, *MODEL_OVERRIDES, f"train.init_from={output}", f"train.init_skip=[{head}]", tmp_path=tmp_path
    )["model.init_from"]
    assert skipped.status == engine.PASS and " 0 skipped" not in skipped.message, skipped.message
    missing = check(data_dir, *MODEL_OVERRIDES, f"train.init_from={tmp_path / 'none'}", tmp_path=tmp_path)
    assert (
        missing["model.init_from"].status == engine.FAIL and "holds no checkpoint" in missing["model.init_from"].message
    )
    wrong = check(
        data_dir, *MODEL_OVERRIDES, f"train.init_from={output}", "train.init_skip=[no_such_layer]", tmp_path=tmp_path
    )["model.init_from"]
    assert wrong.status == engine.FAIL and "'no_such_layer' names no weight" in wrong.message
    assert check(data_dir, *MODEL_OVERRIDES, tmp_path=tmp_path)["model.init_from"].status == engine.SKIP
