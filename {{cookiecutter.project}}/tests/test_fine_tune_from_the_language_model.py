"""Pretrain, then fine-tune, in one project (a project that holds both text tasks): the text
classifier starts from the language model's run. The two models' token and position embeddings,
Transformer blocks and final norm share names and shapes, so the classifier loads every one of them
and only its own head starts new; its text is encoded with the language model's tokenizer
(`data.tokenizer`), so the loaded embeddings' ids mean the pieces they were trained on."""

import json

import pytest

from conftest import config_file, finished_run_of, run_preprocess, task_config, task_sample
from test_warm_start import model_of, source_values
from {{ cookiecutter.package }} import tasks
from {{ cookiecutter.package }}.core import trainer, warm_start
from {{ cookiecutter.package }}.core.errors import UserError

CLASSIFIER = "text_classification"


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """The language model's shared short run (conftest.finished_run_of), the pretraining."""
    return finished_run_of("language_model", tmp_path_factory)[1]


def test_the_classifier_loads_all_but_its_head_from_the_language_models_run(
    pretrained, tmp_path_factory, tmp_path, capsys
):
    raw, _ = task_sample(CLASSIFIER, tmp_path_factory)
    data = tmp_path / "data"
    own = [item for item in tasks.load(CLASSIFIER).testing().overrides if item.startswith("data.")]
    arguments = ["--config", str(config_file(CLASSIFIER)), "--num_shards", "2", *own, f"data.tokenizer={pretrained}"]
    manifest = run_preprocess(raw, data, *arguments)
    exported = json.loads((pretrained / "export" / "assets.extra" / "manifest.json").read_text())
    assert manifest["tokenizer"]["sha256"] == exported["tokenizer"]["sha256"]

    run = tmp_path / "fine-tune"
    cfg = task_config(CLASSIFIER, data, run, f"train.init_from={pretrained}", "train.total_steps=8")
    trainer.train(cfg, tasks.load(CLASSIFIER))
    said = capsys.readouterr().out
    assert "the same tokenizer as the source run" in said
    record = json.loads((run / "metrics.json").read_text())["initialised_from"]
    model = model_of(cfg)
    paths = [warm_start.weight_path(variable) for variable in model.weights]
    head = [path for path in paths if path.split("/")[0] == "logits"]
    assert head and [entry.split(" ")[0] for entry in record["new"]] == head and not record["skipped"]
    assert record["loaded"] == len(paths) - len(head)
    # Every block of the language model is among the loaded weights, which began as the source's.
    source = source_values(warm_start.checkpoint_of(str(pretrained)))
    assert {path for path in paths if path not in head} <= set(source)
    assert any(path.startswith("block0_") for path in paths if path not in head)


def test_the_classifiers_own_tokenizer_is_refused_with_the_fix(pretrained, tmp_path_factory, tmp_path):
    """Text encoded with the classifier's own tokenizer: the same ids mean other pieces, so the start
    is refused in one line that gives the data.tokenizer to preprocess with."""
    _, own = task_sample(CLASSIFIER, tmp_path_factory)
    cfg = task_config(CLASSIFIER, own, tmp_path / "refused", f"train.init_from={pretrained}")
    with pytest.raises(UserError, match=f"preprocess with data.tokenizer={pretrained} to share it") as raised:
        trainer.train(cfg, tasks.load(CLASSIFIER))
    assert "\n" not in str(raised.value)
