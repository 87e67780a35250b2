"""__task__'s own tests (the contract every task meets is tested in tests/test_contract.py, for
this task too). Replace these with tests of your raw format, model and objective."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from {{ cookiecutter.package }}.core.task import RawExample, RawRejection
from {{ cookiecutter.package }}.tasks.__task__ import TASK
from {{ cookiecutter.package }}.tasks.__task__.task import DataConfig, NewTask


def test_csv_rows_become_examples_and_broken_rows_are_rejected():
    raw_bytes = b"a,b,target\n1,2,3\n1,2\nx,2,3\n4,5,inf\n\n6,7,8\n"
    items = list(TASK.read_raw("rows.csv", raw_bytes))
    examples = [item for item in items if isinstance(item, RawExample)]
    rejected = [(item.source, item.reason) for item in items if isinstance(item, RawRejection)]
    assert [(e.source, e.payload["features"], e.target) for e in examples] == [
        ("rows.csv:2", [1.0, 2.0], 3.0),
        ("rows.csv:7", [6.0, 7.0], 8.0),
    ]
    assert rejected == [("rows.csv:3", "bad_row"), ("rows.csv:4", "not_a_number"), ("rows.csv:5", "not_a_number")]
    assert [item.reason for item in TASK.read_raw("x.csv", b"a,b\n1,2\n")] == ["no_target"]


def test_standardisation_statistics_come_from_the_train_rows():
    rows = [{"features": [float(i), 2.0 * i], "target": 10.0 + i} for i in range(5)]
    statistics = json.loads(TASK.fit_encoding(rows, DataConfig(num_features=2), "unused")["statistics.json"])
    np.testing.assert_allclose(statistics["feature_mean"], [2.0, 4.0])
    np.testing.assert_allclose(statistics["feature_std"], [np.std(range(5)), 2 * np.std(range(5))])
    assert statistics["target_mean"] == pytest.approx(12.0) and statistics["rows"] == 5


def test_feature_noise_is_read_at_run_time_from_the_batch_key():
    """data.feature_noise, given to parse_batch with the run's config: none at 0 and outside training;
    in training each feature moves by that many of its standard deviations (the manifest's), the same
    draws for the same batch key and others for another. The parsing written here (NewTask's), which a
    task that wraps its output in its own structure still calls."""
    std = [1.0, 4.0]
    manifest = {"num_features": 2, "statistics": {"feature_mean": [0.0, 0.0], "feature_std": std}}
    example = lambda i: RawExample(f"r{i}", float(i), {"features": [float(i), -float(i)], "target": float(i)})  # noqa: E731
    records = [TASK.encode(example(i), DataConfig(num_features=2), {}, {})[0] for i in range(2000)]
    serialized, key = tf.constant(records), tf.constant([1, 2], tf.int64)
    parse_batch = NewTask().parse_batch
    clean = parse_batch(serialized, manifest)[0].numpy()

    def parsed(noise, training=True, seed=key):
        config = DataConfig(num_features=2, feature_noise=noise)
        return parse_batch(serialized, manifest, training=training, seed=seed, data_config=config)[0].numpy()

    np.testing.assert_array_equal(parsed(0.0), clean)
    np.testing.assert_array_equal(parsed(0.5, training=False), clean)
    moved = (parsed(0.5) - clean) / np.array(std)
    np.testing.assert_allclose(moved.std(axis=0), [0.5, 0.5], rtol=0.06)  # 2,000 draws a feature: ~1.6% apart
    np.testing.assert_array_equal(parsed(0.5), parsed(0.5))
    assert not np.array_equal(parsed(0.5), parsed(0.5, seed=tf.constant([1, 3], tf.int64)))
    assert DataConfig(feature_noise=-1.0).problem() == "data.feature_noise must be at least 0, got -1.0"


def test_predict_reads_rows_without_a_target(tmp_path):
    path = tmp_path / "predict.csv"
    path.write_text("a,b\n1,2\n3,4\n")
    names, batch = TASK.predict_inputs([str(path)], {"num_features": 2}, str(tmp_path))
    assert names == ["predict.csv:2", "predict.csv:3"] and batch.tolist() == [[1.0, 2.0], [3.0, 4.0]]
