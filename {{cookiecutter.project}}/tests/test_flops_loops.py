"""Model FLOPs and the memory plan of recurrent models (core/memory.py): a loop's body counted times
its length, what a loop stacks for its backward pass planned, and a loop whose length is known only
when it runs named instead of counted as nothing; checked against hand counts of the LSTM's
equations, and on the step lines of a real 8-replica fit."""

from __future__ import annotations

import contextlib
import re

import numpy as np
import pytest
import tensorflow as tf

from conftest import REPLICAS, task_config
from {{ cookiecutter.package }} import tasks
from {{ cookiecutter.package }}.core import callbacks, memory, precision, utilisation
from {{ cookiecutter.package }}.core.keras import keras
from {{ cookiecutter.package }}.core.topology import Target

layers = keras.layers

VOCABULARY, WIDTH, UNITS, CLASSES = 50, 16, 32, 5
# Matrix multiplies of one step per example, by cell: each gate multiplies the step's input (WIDTH)
# and the previous output (UNITS) by UNITS columns. 2 FLOPs per multiply-add.
GATES = {"LSTM": 4, "GRU": 3, "SimpleRNN": 1}


def recurrent(cell: str = "LSTM", length: int | None = 12):
    """tokens -> Embedding -> a recurrent layer over `length` steps (None: any length) -> Dense."""
    keras.utils.set_random_seed(1)
    tokens = keras.Input((length,), dtype="int32", name="tokens")
    x = layers.Embedding(VOCABULARY, WIDTH, name="embedding")(tokens)
    x = getattr(layers, cell)(UNITS, name="recurrent")(x)
    return keras.Model(tokens, layers.Dense(CLASSES, name="head")(x), name="tagger")


def forward_by_hand(cell: str, length: int, batch: int) -> int:
    """One forward pass: every step's gates, then the head."""
    step = GATES[cell] * (WIDTH + UNITS) * UNITS * 2 * batch
    return length * step + UNITS * CLASSES * 2 * batch


@pytest.mark.parametrize("cell", sorted(GATES))
def test_a_recurrent_layers_flops_are_its_steps_multiplies_times_the_sequence_length(cell):
    batch = 4
    for length in (12, 24):
        model, hand = recurrent(cell, length), forward_by_hand(cell, length, batch)
        counted = memory.count_forward(model, batch)
        assert counted.unknown == () and counted.counted == pytest.approx(hand, rel=0.15)
        assert counted.counted == hand  # exactly: the loop's body times its length, the head once
        assert memory.trace(model, batch).forward_flops == hand  # the training step's forward pass


def test_a_loop_of_unknown_length_is_named_in_the_flops_the_lines_metrics_and_the_plan():
    model = recurrent("LSTM", None)  # any sequence length: the loop's length is known when it runs
    counted = memory.count_forward(model, 4)
    assert counted.unknown == ("a loop of unknown length in tagger/recurrent",)
    used = utilisation.Utilisation(counted.counted, Target("cpu", REPLICAS, 1), "float32", "", counted.unknown)
    assert used.tflops_per_chip(2.0) is None and used.mfu(2.0) is None
    assert used.describe() == (
        "model FLOPs unknown: a loop of unknown length in tagger/recurrent; no TFLOP/s or utilisation"
    )
    assert used.describe_rate(2.0) == "model FLOPs unknown: a loop of unknown length in tagger/recurrent"
    assert used.metrics(2.0) == {"model_flops_unknown": "a loop of unknown length in tagger/recurrent"}
    traced = memory.trace(model, 4)
    assert traced.unplanned == ("what a loop of unknown length in tagger/recurrent keeps",)
    planned = memory.plan(
        traced, [], [], per_replica_batch=4, optimizer="sgd", momentum=0.9, accumulation_steps=1, hbm=0
    )
    assert planned.breakdown().endswith("; not counted: what a loop of unknown length in tagger/recurrent keeps")
    # A known count reads as before, with the decimals a small model needs.
    known = utilisation.Utilisation(2.5e9, Target("cpu", REPLICAS, 1), "float32", "")
    assert known.metrics(0.02) == {"tflops_per_chip": 0.00005}  # metrics.json: 4 significant digits
    assert known.describe_rate(0.2).strip() == "0.0005000 TFLOP/s/chip"


class Repeated(layers.Layer):
    """Multiplies its input by a square kernel once per trip of a tf.while_loop whose counter starts
    at `start`, moves by `advance` and runs while `condition` holds."""

    def __init__(self, start, advance, condition, **kwargs):
        super().__init__(**kwargs)
        self.start, self.advance, self.condition = start, advance, condition

    def build(self, shape):
        self.kernel = self.add_weight(name="kernel", shape=(shape[-1], shape[-1]))

    def call(self, x):
        step = lambda i, y: (self.advance(i), tf.matmul(y, self.kernel))  # noqa: E731
        return tf.while_loop(lambda i, _: self.condition(i), step, (tf.constant(self.start), x))[1]


class Branching(layers.Layer):
    """An If (two branches) or a Case (more) on the data, each branch multiplying its input by a
    square kernel as many times as `costs` says."""

    def __init__(self, costs, **kwargs):
        super().__init__(**kwargs)
        self.costs = costs

    def build(self, shape):
        self.kernel = self.add_weight(name="kernel", shape=(shape[-1], shape[-1]))

    def call(self, x):
        def branch(count):
            def multiplied():
                y = x
                for _ in range(count):
                    y = tf.matmul(y, self.kernel)
                return y

            return multiplied

        index = tf.cast(tf.reduce_sum(x) > 0, tf.int32)  # known only when it runs
        if len(self.costs) == 2:
            return tf.cond(index > 0, branch(self.costs[0]), branch(self.costs[1]))
        return tf.switch_case(index, [branch(count) for count in self.costs])


def counted(layer, batch: int = 4):
    """The forward FLOPs of Input(SIDE) -> `layer`, and one multiply's by hand."""
    inputs = keras.Input((SIDE,), name="features")
    return memory.count_forward(keras.Model(inputs, layer(inputs), name="looped"), batch), 2 * batch * SIDE * SIDE


SIDE = 8
LOOPS = {  # a loop's counter: start, how it moves, the condition; the trips by hand
    "i < 5": (0, lambda i: i + 1, lambda i: i < 5, 5),
    "i <= 5": (0, lambda i: i + 1, lambda i: i <= 5, 6),
    "i < 7, by 2": (0, lambda i: i + 2, lambda i: i < 7, 4),
    "i <= 6, by 2": (0, lambda i: i + 2, lambda i: i <= 6, 4),
    "5 > i (the counter on the right)": (0, lambda i: i + 1, lambda i: tf.greater(5, i), 5),
    "5 >= i": (0, lambda i: i + 1, lambda i: tf.greater_equal(5, i), 6),
    "i > 0, down": (5, lambda i: i - 1, lambda i: i > 0, 5),
    "i >= 0, down": (5, lambda i: i - 1, lambda i: i >= 0, 6),
    "0 < i, down by 2": (7, lambda i: i - 2, lambda i: tf.less(0, i), 4),
    "i != 6, by 2": (0, lambda i: i + 2, lambda i: tf.not_equal(i, 6), 3),
    "i != 0, down by 3": (9, lambda i: i - 3, lambda i: tf.not_equal(0, i), 3),
    "i < 5 and i < 3": (0, lambda i: i + 1, lambda i: tf.logical_and(i < 5, i < 3), 3),
    "i < 0 (never runs)": (0, lambda i: i + 1, lambda i: i < 0, 0),
    "i < 3 from 5 (never runs)": (5, lambda i: i + 1, lambda i: i < 3, 0),
    "i > 5, down (never runs)": (0, lambda i: i - 1, lambda i: i > 5, 0),
    "i != 0 from 0 (never runs)": (0, lambda i: i + 1, lambda i: tf.not_equal(i, 0), 0),
    "i >= 0, down by 2": (5, lambda i: i - 2, lambda i: i >= 0, 3),
    "i < 7, 2 + i (the counter on the right of its step)": (0, lambda i: 2 + i, lambda i: i < 7, 4),
    "i < 8 from 1, by 3": (1, lambda i: i + 3, lambda i: i < 8, 3),
    "i <= 8 from 3, by 2": (3, lambda i: i + 2, lambda i: i <= 8, 3),
    "i > 2 from 10, down by 3": (10, lambda i: i - 3, lambda i: i > 2, 3),
    "i >= 2 from 9, down by 2": (9, lambda i: i - 2, lambda i: i >= 2, 4),
    "i != 10 from 1, by 3": (1, lambda i: i + 3, lambda i: tf.not_equal(i, 10), 3),
}


@pytest.mark.parametrize("name", sorted(LOOPS))
def test_a_loops_body_is_counted_once_per_trip_whatever_its_condition(name):
    start, advance, condition, trips = LOOPS[name]
    count, multiply = counted(Repeated(start, advance, condition, name="repeated"))
    assert count.unknown == () and count.counted == trips * multiply, name


@pytest.mark.parametrize(
    "name, advance, condition",
    [
        ("i != 5, by 2 (steps over 5)", lambda i: i + 2, lambda i: tf.not_equal(i, 5)),
        ("i != -2, by 2 (past it already)", lambda i: i + 2, lambda i: tf.not_equal(i, -2)),
        ("i > 0, up (runs on)", lambda i: i + 1, lambda i: i >= 0),
        ("i < 5, by a product", lambda i: i * 2 + 1, lambda i: i < 5),
    ],
)
def test_a_loop_whose_trips_cannot_be_read_is_named_not_guessed(name, advance, condition):
    count, _ = counted(Repeated(0, advance, condition, name="repeated"))
    assert count.unknown == ("a loop of unknown length in looped/repeated",), name
    assert count.counted == 0, name  # the loop is the model's only multiply: nothing guessed for it


@pytest.mark.parametrize("costs", [(2, 1), (1, 3), (1, 3, 2), (3, 1, 2), (1, 2, 4)])
def test_a_branch_is_counted_by_its_costliest_side(costs):
    """Which branch runs is known only when it runs: the plan is for the worst one."""
    count, multiply = counted(Branching(costs, name="branching"))
    assert count.unknown == () and count.counted == max(costs) * multiply


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("frozen", ["", "recurrent", "head", "embedding", "recurrent,head"])
def test_a_frozen_layers_multiplies_lose_their_weight_gradient_in_the_count(frozen, policy):
    """`train.freeze` (warm_start.freeze): a frozen weight's multiplies count forward and for their
    input's gradient but not for their weight's, 2 x of training's 3 x: the LSTM's inside its loop,
    times its length; the head's once; an embedding (a lookup) has none. In bfloat16 the multiplies
    read a cast of the weight."""
    from {{ cookiecutter.package }}.core import warm_start

    batch, length = 4, 12
    with precision.policy(policy):
        model = recurrent("LSTM", length)
        warm_start.freeze(model, [name for name in frozen.split(",") if name])
        steps, head = forward_by_hand("LSTM", length, batch) - UNITS * CLASSES * 2 * batch, UNITS * CLASSES * 2 * batch
        want = {"": 0, "recurrent": steps, "head": head, "embedding": 0, "recurrent,head": steps + head}[frozen]
        count = memory.count_forward(model, batch)
        traced = memory.trace(model, batch)
    assert count.counted == steps + head and count.frozen == want and count.training == 3 * (steps + head) - want
    assert traced.frozen_flops == want and traced.training_flops_per_example == (3 * (steps + head) - want) / batch


def test_a_frozen_layer_under_the_strategy_is_known_by_each_replicas_handle(strategy):
    """Built under the 8 replicas' MirroredStrategy, as training builds it: a frozen weight is a
    mirrored variable, which the traced call reads through one replica's handle."""
    from {{ cookiecutter.package }}.core import warm_start

    with strategy.scope():
        model = recurrent("LSTM", 12)
    warm_start.freeze(model, ["head"])
    assert memory.count_forward(model, 4).frozen == UNITS * CLASSES * 2 * 4


@pytest.mark.parametrize("costs", [(2, 1), (1, 3), (1, 3, 2)])
def test_a_frozen_branch_counts_its_costliest_sides_multiplies_as_frozen(costs):
    from {{ cookiecutter.package }}.core import warm_start

    layer = Branching(costs, name="branching")
    inputs = keras.Input((SIDE,), name="features")
    model = keras.Model(inputs, layer(inputs), name="looped")
    warm_start.freeze(model, ["branching"])
    count, multiply = memory.count_forward(model, 4), 2 * 4 * SIDE * SIDE
    assert count.counted == count.frozen == max(costs) * multiply and count.training == 2 * count.counted


@pytest.mark.parametrize("policy, size", [("float32", 4), ("bfloat16", 2)])
def test_the_plan_keeps_what_an_lstm_stacks_for_its_backward_pass(policy, size):
    """The hand count, from the LSTM's equations: the gradient of a step reads its input x_t and
    the previous h and c (the kernels' and the cell's gradients), the gates i, f, o and the
    candidate g (the cell's), and tanh(c_t) (the output's): WIDTH + 7 x UNITS numbers per example
    and step, in the compute dtype, stacked over the steps."""
    batch, short, long = 4, 12, 36
    per_step = batch * (WIDTH + 7 * UNITS) * size
    plans = {}
    with precision.policy("mixed_bfloat16" if policy == "bfloat16" else "float32"):
        for length in (short, long):
            traced = memory.trace(recurrent("LSTM", length), batch)
            # Besides, 8 bytes a step of bookkeeping (a step's shape for the input list's gradient).
            assert traced.loop_bytes == pytest.approx(length * per_step, rel=0.01)
            # Beside the stacks: the head's input (the last h) and the token ids (for the embedding's
            # gradient); the kernels that the LSTM's function passes on are weights, not activations.
            assert traced.activation_bytes - traced.loop_bytes == batch * UNITS * size + batch * length * 4
            plans[length] = memory.plan(
                traced, [], [], per_replica_batch=8, optimizer="sgd", momentum=0.9, accumulation_steps=1, hbm=0
            )
    grown = plans[long].activations - plans[short].activations
    # The plan of 8 examples grows by what 24 more steps stack (and the 24 more token ids it keeps).
    assert grown == pytest.approx((long - short) * per_step * 2, rel=0.02)
    assert plans[long].loops == pytest.approx(long * per_step * 2, rel=0.01)
    assert "of which loops stack" in plans[long].breakdown()


def fit_with_step_log(build, tmp_path, strategy=None):
    """Trains the model `build()` returns for 6 steps of 32 examples of 12 tokens (on 8 replicas
    under `strategy`, else on one device) with the trainer's step log and its count
    (`utilisation.of_model`): (the config, the report)."""
    cfg = task_config(
        tasks.DEFAULT,
        tmp_path / "data",
        tmp_path / "run",
        "runtime.mixed_precision=float32",
        f"runtime.cache_dir={tmp_path / 'cache'}",
        "train.total_steps=6",
        "train.log_every=2",
        "train.warmup_steps=1",
    )
    utilisation.store_host_peak(cfg.runtime.cache_dir, "float32", 1e12)
    target = Target("cpu", REPLICAS if strategy else 1, 1)
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = build()
        model.compile(
            optimizer=keras.optimizers.SGD(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=2,
        )
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, VOCABULARY, size=(cfg.train.global_batch_size * 6, 12)).astype("int32")
    labels = rng.integers(0, CLASSES, size=(len(tokens),)).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((tokens, labels)).batch(cfg.train.global_batch_size).repeat()
    report = callbacks.Report(step=0)
    log = callbacks.StepLog(
        0,
        cfg,
        tf.summary.create_file_writer(str(tmp_path / "logs")),
        ["loss"],
        lambda: utilisation.of_model(model, cfg, target),
        report,
    )
    model.fit(dataset, epochs=1, steps_per_epoch=6, callbacks=[log], verbose=0)
    return cfg, report


def test_a_recurrent_models_step_lines_show_its_model_flops(float32_policy, strategy, tmp_path, capsys):
    """A real fit on 8 CPU replicas: the LSTM's FLOPs per step within 15% of the hand count, and
    TFLOP/s per chip from them on every timed line."""
    cfg, report = fit_with_step_log(lambda: recurrent("LSTM", 12), tmp_path, strategy)
    printed = capsys.readouterr().out
    lines = [line for line in printed.splitlines() if line.startswith("step")]
    assert len(lines) == 3
    # The trainer's convention: 3 x the forward pass (the backward pass multiplies twice), per
    # example, times the examples of a step.
    hand = 3 * forward_by_hand("LSTM", 12, 1) * cfg.effective_batch_size
    shown = float(re.search(r"model FLOPs ([\d.]+) GFLOP per step", printed).group(1)) * 1e9
    assert shown == pytest.approx(hand, rel=0.15)
    assert report.utilisation.flops_per_step == hand
    timed = [line for line in lines if "nan steps/s" not in line]  # the first execution is not timed
    assert len(timed) == 2
    for line in timed:
        rate = float(re.search(r"([\d.]+) steps/s", line).group(1))
        tflops = float(re.search(r"([\d.]+) TFLOP/s/chip", line).group(1))
        assert tflops > 0 and tflops == pytest.approx(hand * rate / 1e12, rel=0.02)
        assert "MFU" in line


def test_the_step_lines_of_a_model_whose_flops_are_unknown_say_so(float32_policy, tmp_path, capsys):
    """An LSTM over sequences of any length (one device: the lines are the same on 8): the start
    line and every step line name the loop instead of showing 0 TFLOP/s."""
    _, report = fit_with_step_log(lambda: recurrent("LSTM", None), tmp_path)
    printed = capsys.readouterr().out
    lines = [line for line in printed.splitlines() if line.startswith("step")]
    unknown = "model FLOPs unknown: a loop of unknown length in tagger/recurrent"
    assert len(lines) == 3 and all(line.endswith(unknown) for line in lines)
    assert f"{unknown}; no TFLOP/s or utilisation" in printed and "TFLOP/s/chip" not in printed
    assert report.utilisation.metrics(2.0) == {"model_flops_unknown": unknown.split(": ", 1)[1]}
