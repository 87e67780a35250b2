"""Learning rate: linear scaling, warm-up, decay; the Keras schedule equals the plain formula."""

import pytest

from {{ cookiecutter.package }} import tasks
from {{ cookiecutter.package }}.core import config, schedule


def test_linear_scaling_rule():
    assert schedule.scaled_learning_rate(0.1, 1024, 256) == pytest.approx(0.4)
    assert schedule.scaled_learning_rate(0.1, 128, 256) == pytest.approx(0.05)


@pytest.mark.parametrize(
    "step, expected",
    [
        (0, 0.0),
        (50, 0.2),
        (99, 0.396),
        (100, 0.4),  # warm-up: linear from 0 to the scaled peak
        (550, 0.2),  # half-way through the cosine decay
        (1000, 0.0),
        (1200, 0.0),  # at and after total_steps
    ],
)
def test_schedule_values(step, expected):
    cfg = config.load(
        None,
        [
            "train.base_learning_rate=0.1",
            "train.base_batch_size=256",
            "train.global_batch_size=1024",
            "train.warmup_steps=100",
            "train.total_steps=1000",
        ],
        registry=tasks,
    )
    keras_schedule = schedule.from_config(cfg.train)
    assert float(keras_schedule(step)) == pytest.approx(expected, abs=1e-6)
    assert schedule.learning_rate_at(step, 0.4, 100, 1000) == pytest.approx(expected, abs=1e-6)
