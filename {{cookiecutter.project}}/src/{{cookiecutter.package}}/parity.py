"""Parity: does the model train on N replicas as it trains on one device?

    python -m {{ cookiecutter.package }}.parity --config configs/local.yaml [--steps 6] [--tolerance T] [dotted.key=value ...]

The Cloud TPU troubleshooting guide's check for an accuracy drop on many cores: the same initial
weights train the same `--steps` global batches (read once from the train split) on one device and
on every replica of the run's strategy, in float32 with dropout off (Keras' Dropout and noise layers,
the dropout of its recurrent cells and dense attention layers: their random numbers differ per
device), and the losses are compared step by step.

They agree when they differ by no more than float32 summation order explains, and by more they do
not, however small the difference: a per-replica mean that is not the global batch's moves a loss by
about 1e-4, below the 1e-3 a pair of curves is often read with, and trains another objective all the
same. What summation order explains is measured, not assumed: the one-device model trains the same
steps again from the same start twice more, with the examples of each batch in reverse order and with
its second half first, which makes every sum over the batch in another order and changes nothing else
(`ORDER_FACTOR` times the largest difference either makes, at least `ROUNDING`). `--tolerance`
replaces that bound, and the verdict says so. The initial weights come from `runtime.seed`: the same
command gives the same verdict.

The one-device side trains the whole global batch on one replica's memory: running out of it is one
line with that side's plan and a global batch one replica holds (`out_of_memory`).

The comparison means something only if the one-device run repeats itself: parity trains the same
steps again on the same model, from the same trainable weights and optimizer state (the same traced
step, whose random generators carry on, and so does any other state the model keeps in non-trainable
weights: a counter that seeds its noise). A deterministic model repeats its losses to float32
rounding (`ROUNDING`); on a GPU parity turns on TensorFlow's op determinism for that (kernels that
sum in another order each run would move them further). A model that draws random numbers in
training that parity cannot switch off (a noise layer of the task's own that is no Keras Dropout,
sampling in the loss) does not repeat them, and its two curves differ by chance as well: parity then
names the layers whose traced step draws random numbers, says how to switch them off, gives no
verdict on the replicas and exits with 1. Otherwise it prints where the curves part and why:

- the same weights give another loss on the same batch in inference mode: the objective depends on
  how the batch is split (a batch-level loss, e.g. in-batch negatives, computed on each replica's
  share; gather it in the task's step loss, `build_step_loss`);
- they agree in inference mode but not in training mode: the model normalises over each replica's
  share of the batch (BatchNormalization that is not synchronised);
- they agree at first and drift apart: an update that depends on the replica, or statistics over
  each replica's share of the batch (raise --tolerance to see how far);

with the task's step loss (`build_step_loss`) named first when the task has one: a loss divided by a
count of each replica's own (its tokens, its masked positions) is the likeliest cause, and
`core.model.global_mean` the fix;

and, separately, how far the run's own precision (mixed bfloat16) moves the one-device loss. It exits
with 0 when the curves agree, or part only by unsynchronised BatchNormalization (a choice: per-replica
statistics are the usual practice with a large per-replica batch); with 1 for random numbers in
training or any other cause. Gradient accumulation is left out (1 micro-batch): what differs between 1
and N replicas is the split of each batch, which it does not change.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import sys
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from . import tasks
from .core import config as config_lib
from .core import distribute, input_pipeline, levers, memory, precision, recompute
from .core.errors import UserError, run_cli
from .core.keras import keras
from .core.model import build_model, compile_model

# How far a deterministic step may move its loss when run again from the same weights on the same batch.
# On a CPU or a TPU, not at all: the same traced step repeats bit for bit (each task of this project:
# 0.0). On a GPU some kernels (atomic adds in reductions and scatters, cuDNN's convolution gradients)
# sum in another order each run, by default; a sum in another order differs by a few float32 roundings
# (each at most 2^-24 of the value; epsilon is 2^-23), which an optimizer like Adam can amplify past
# this bound within a few steps, so on a GPU parity runs with TensorFlow's op determinism on
# (`deterministic_gpu`) and the step repeats as on a CPU. 4 epsilons (4.8e-7) leaves room for rounding
# all the same: even a whole other summation order, one device against 8 replicas, stays within 2e-7
# over 6 steps for each task here, while random numbers of any use move a loss by 1e-5 or more (a 10%
# word dropout on a tagger: 6e-4).
ROUNDING = 4 * float(np.finfo(np.float32).eps)

# How far from the one-device curve summation order may move the N-replica curve: this many times what
# the same steps with each batch's examples reversed, or with its halves swapped, move it at most
# (`Curves.order`). All are other orders of the same sums (the replicas add their shares' partial sums;
# the reorderings add the rows in another order), and how far one order lands from another varies with
# the order: the image bake's small run (2 replicas, batches of 8, 3 steps, synchronised normalisation)
# over seeds 0 to 21 moved its loss by 0.05x to 1.8x what the reversal alone moved it, and by 0.05x to
# 1.8x the larger of the two reorderings; the in-batch loss over the gathered batch of
# tests/test_parity.py (8 replicas, batches of 64, 3 steps) over seeds 0 to 5 by 1.1x to 4.7x the
# larger. `make parity` on the sample data (8 CPU
# replicas, 6 steps): the next-token model's replicas moved its loss by 8.7e-8 and the reversal by
# 8.7e-8; the text classifier's 6.9e-8 and 6.9e-8; the image model with synchronised batch
# normalisation 2.9e-4 and 2.1e-4 (1.4x: its normalisation's variance cancels digits, and the
# optimizer grows the rounding step after step; the bound grows with it). 10x leaves twice the room
# of the widest of those, and stays far below what a wrong objective moves where the rounding is
# float32's: a per-replica mean over counts of 1 +- 1% an example moves the loss by 2.6e-4 to 2.8e-4
# (tests/test_parity.py), 350 times the bound there.
ORDER_FACTOR = 10

# The layers parity knows to draw random numbers in training, and the attributes that switch each off
# (subclasses included: SpatialDropout2D is a Dropout). The recurrent cells draw the masks of their
# `dropout` and `recurrent_dropout`; the LSTM, GRU and SimpleRNN layers read both from their `cell`
# (a Bidirectional wrapper holds one such layer each way), so switching the cell off switches the layer.
NOISE_LAYERS = (
    (keras.layers.Dropout, ("rate",)),
    (keras.layers.GaussianDropout, ("rate",)),
    (keras.layers.AlphaDropout, ("rate",)),
    (keras.layers.GaussianNoise, ("stddev",)),
    (keras.layers.LSTMCell, ("dropout", "recurrent_dropout")),
    (keras.layers.GRUCell, ("dropout", "recurrent_dropout")),
    (keras.layers.SimpleRNNCell, ("dropout", "recurrent_dropout")),
    (keras.layers.Attention, ("dropout",)),
    (keras.layers.AdditiveAttention, ("dropout",)),
)

# The ops of a traced step that draw random numbers: stateful random ops (a new draw at every run),
# the read of a tf.random.Generator's state (RngReadAndSkip, which feeds a stateless op the next
# numbers) and the candidate samplers of sampled losses.
RANDOM_OPS = frozenset(
    {
        "RandomUniform",
        "RandomUniformInt",
        "RandomStandardNormal",
        "TruncatedNormal",
        "ParameterizedTruncatedNormal",
        "RandomGamma",
        "RandomPoisson",
        "RandomPoissonV2",
        "RandomShuffle",
        "Multinomial",
        "StatefulUniform",
        "StatefulUniformInt",
        "StatefulUniformFullInt",
        "StatefulStandardNormal",
        "StatefulStandardNormalV2",
        "StatefulTruncatedNormal",
        "StatefulRandomBinomial",
        "RngReadAndSkip",
        "RngSkip",
        "NonDeterministicInts",
        "SampleDistortedBoundingBox",
        "SampleDistortedBoundingBoxV2",
        "UniformCandidateSampler",
        "LogUniformCandidateSampler",
        "LearnedUnigramCandidateSampler",
        "FixedUnigramCandidateSampler",
        "ThreadUnsafeUnigramCandidateSampler",
    }
)


@dataclass
class Curves:
    """The losses of the same batches from the same weights on one device and on N replicas."""

    replicas: int
    one_device: list[float]
    replicated: list[float]
    one_device_inference: float
    replicated_inference: float
    tolerance: float | None
    """The bound given with --tolerance; None: the bound is what summation order explains (`bound`)."""
    unsynchronised_norms: list[str] = field(default_factory=list)
    initial: list = field(default_factory=list, repr=False)
    """The initial weights both sides started from."""
    replayed: list[float] = field(default_factory=list)
    """The one-device losses of the same steps again, from the same trainable weights and optimizer state."""
    random_layers: list[str] = field(default_factory=list)
    """Where the one-device step draws random numbers, 'layer (op types)' each (found when it does)."""
    op_determinism: bool = False
    """Whether TensorFlow's op determinism was on (`main` turns it on on a GPU: `deterministic_gpu`)."""
    reordered: list[float] = field(default_factory=list)
    """The one-device losses of the same steps again from the same start, each batch's examples in
    reverse order: the same sums in another order."""
    rotated: list[float] = field(default_factory=list)
    """The same again with each batch's second half of examples first: another order of the same sums."""
    step_loss: bool = False
    """Whether the model trains on a task's step loss (`build_step_loss`)."""

    @staticmethod
    def relative(a: float, b: float) -> float:
        return abs(a - b) / max(abs(a), abs(b), 1e-12)

    @property
    def noise(self) -> float:
        """The largest relative difference between the one-device curve and its replay: 0 for a
        deterministic step on a CPU or a TPU."""
        return max((self.relative(a, b) for a, b in zip(self.one_device, self.replayed)), default=0.0)

    @property
    def order(self) -> float:
        """The largest relative difference between the one-device curve and the same steps with each
        batch's examples reversed or its halves swapped: what float32 summation order moves the loss by,
        here."""
        return max(
            (self.relative(a, b) for other in (self.reordered, self.rotated) for a, b in zip(self.one_device, other)),
            default=0.0,
        )

    @property
    def bound(self) -> float:
        """How far apart the one-device and N-replica losses may be and still agree: --tolerance when
        given, else what summation order explains (ORDER_FACTOR x `order`, at least ROUNDING)."""
        if self.tolerance is not None:
            return self.tolerance
        return max(ROUNDING, ORDER_FACTOR * self.order)

    def bound_text(self) -> str:
        """Where the bound comes from, for the verdict."""
        measured = (
            f"float32 summation order: the same steps on one device with each batch's examples reversed or its "
            f"halves swapped move the loss by up to {self.order:.1e}"
        )
        if self.tolerance is not None:
            return f"tolerance {self.tolerance:g}, given with --tolerance; {measured}"
        return f"bound {self.bound:.1e}: {measured}; {ORDER_FACTOR}x that, at least {ROUNDING:.1e}"

    @property
    def draws_random_numbers(self) -> bool:
        """Whether one device, trained again on the same batches from the same weights, moves its
        losses by more than float32 rounding."""
        return self.noise > ROUNDING

    def randomness(self) -> str:
        """What the replay found, where, and how to make the model comparable."""
        where = (
            ", ".join(self.random_layers)
            if self.random_layers
            else "no random op under a layer's name in the traced step (look in the task's loss, and in layers "
            "that keep their own random state or seed stateless random ops from a variable they update)"
        )
        return (
            f"random numbers in training: the same {len(self.replayed)} steps again on one device, from the same "
            f"trainable weights on the same batches, give other losses (up to {self.noise:.1e} apart; float32 "
            f"rounding stays within {ROUNDING:.1e}), so the one-device and {self.replicas}-replica curves differ by "
            f"chance too. Drawn in: {where}. Parity sets the rate of every keras.layers.Dropout (its subclasses "
            "included), GaussianDropout and AlphaDropout, the stddev of every GaussianNoise, the dropout and "
            "recurrent_dropout of every LSTM, GRU and SimpleRNN cell and the dropout of every Attention and "
            "AdditiveAttention to 0 in both runs; make each layer of the model's own that draws a "
            "keras.layers.Dropout subclass whose call draws nothing when its rate is 0 (Dropout.call returns its "
            "inputs then), give a stock layer's dropout 0 for this run (dotted.key=value), or make it deterministic. "
            "Drawing only when `training` is true is not enough: parity compares training steps"
        )

    @property
    def parting_step(self) -> int | None:
        """The first step whose losses differ by more than the bound; None when none does."""
        for step, (a, b) in enumerate(zip(self.one_device, self.replicated)):
            if self.relative(a, b) > self.bound:
                return step
        return None

    def causes(self, synchronised: "Curves | None" = None) -> list[str]:
        """Why the curves part, each cause one line (empty when they agree). `synchronised`: the same
        comparison with every BatchNormalization synchronised across replicas, when the model has
        unsynchronised ones (the experiment that tells whether they are the cause). A model that draws
        random numbers in training has that one cause: its curves differ by chance, whatever else does."""
        if self.draws_random_numbers:
            return [self.randomness()]
        step = self.parting_step
        if step is None:
            return []
        causes = []
        if self.relative(self.one_device_inference, self.replicated_inference) > self.bound:
            causes.append(
                "per-replica batch-level loss: the same weights give another loss on the same batch in inference "
                f"mode ({self.one_device_inference:.6g} on one device, {self.replicated_inference:.6g} on "
                f"{self.replicas} replicas), so the objective depends on how the batch is split; "
                + (
                    "the task's step loss (build_step_loss) is the likeliest cause: "
                    if self.step_loss
                    else "compute it over the global batch in a step loss (Task.build_step_loss): "
                )
                + GLOBAL_BATCH
            )
        if self.unsynchronised_norms and synchronised is not None:
            names = ", ".join(self.unsynchronised_norms[:3]) + (", ..." if len(self.unsynchronised_norms) > 3 else "")
            agreed = synchronised.parting_step is None
            causes.append(
                f"per-replica BatchNormalization: {len(self.unsynchronised_norms)} layers ({names}) normalise over "
                f"each replica's 1/{self.replicas} of the batch in training; "
                + (
                    "with them synchronised the curves agree: make them synchronized "
                    "(BatchNormalization(synchronized=True); in the image task, model.sync_batch_norm=true), or "
                    "accept the difference when the per-replica batch is large"
                    if agreed
                    else f"with them synchronised the curves still part (at step {synchronised.parting_step}): "
                    "they are not the only cause"
                )
            )
            if agreed:
                return causes
        if not causes:
            causes.append(
                f"the loss of the first batch agrees and the curves drift apart from step {step}: the replicas' "
                "gradients differ from the one device's beyond summation order ("
                + (
                    "the task's step loss (build_step_loss) is the likeliest cause: " + GLOBAL_BATCH + "; else "
                    if self.step_loss
                    else ""
                )
                + "a layer that computes statistics over each replica's share of the batch, or an update that depends "
                "on the replica); raise --tolerance to see how far they drift"
            )
        return causes

    def only_norms(self, synchronised: "Curves | None") -> bool:
        """Whether the curves part only because of unsynchronised BatchNormalization: in inference
        mode the losses agree, and with the layers synchronised the curves agree."""
        return (
            synchronised is not None
            and not self.draws_random_numbers
            and synchronised.parting_step is None
            and self.relative(self.one_device_inference, self.replicated_inference) <= self.bound
        )


# What a step loss over the global batch looks like (core/model.py).
GLOBAL_BATCH = (
    "a loss divided by a count of this replica's own (its tokens, its masked positions, its real examples) is the "
    "replica's mean, not the global batch's; return core.model.global_mean(values, weights) (this replica's "
    "weighted sum over every replica's total weight), and gather what a loss over the batch's pairs needs "
    "(core.model.gather: in-batch negatives)"
)


def layers_of(model) -> list:
    """`model` and every layer in it, nested ones included (the cells of recurrent layers, each way of
    a Bidirectional), as Keras itself walks them: `model.submodules` fails on a model whose LSTM has
    a recurrent_dropout (it cannot sort the keys of the layer's cache of dropout masks)."""
    return list(model._flatten_layers())


def synchronise_norms(model) -> None:
    """Makes every BatchNormalization compute its batch statistics over all replicas (before the
    step is traced; the variables stay the same)."""
    for layer in layers_of(model):
        if isinstance(layer, keras.layers.BatchNormalization) and not getattr(layer, "synchronized", False):
            layer.synchronized, layer.fused = True, False


def single_device(target) -> tf.distribute.Strategy:
    """A one-replica strategy on the same kind of device as `target`."""
    if target.kind == "tpu":
        return distribute.one_tpu_core()
    if target.kind == "gpu":
        return tf.distribute.OneDeviceStrategy(tf.config.list_logical_devices("GPU")[0].name)
    return tf.distribute.OneDeviceStrategy(tf.config.list_logical_devices("CPU")[0].name)


def switched_off(layer) -> bool:
    """Whether `layer` is one of NOISE_LAYERS with every attribute that switches it on at 0."""
    return any(
        isinstance(layer, kind) and not any(getattr(layer, attribute) for attribute in attributes)
        for kind, attributes in NOISE_LAYERS
    )


def deterministic_gpu(target, seed: int) -> bool:
    """On a GPU (`target.kind`), turns on TensorFlow's op determinism for the rest of the process,
    with the seeds set to `seed` (its random ops refuse to run unseeded then); returns whether it
    did. Call it before any model is built: by default some GPU kernels (atomic adds in reductions,
    scatters and cuDNN's convolution gradients) sum in another order each run, and the one-device
    replay would differ from the first run without any random number. On a CPU or a TPU the step
    repeats as it is: nothing changes there."""
    if target.kind != "gpu":
        return False
    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()
    return True


@contextlib.contextmanager
def deterministic_kernels(on: bool):
    """Turns the refusal of an op that has no deterministic GPU kernel (op determinism `on`) into a
    one-line error."""
    try:
        yield
    except tf.errors.UnimplementedError as error:
        if not on or "determinis" not in error.message.lower():
            raise
        raise UserError(
            "on a GPU parity runs with TensorFlow's op determinism on (else kernels that sum in another order each "
            "run make one device differ from itself), and an op of this model has no deterministic GPU kernel: "
            f"{error.message.strip().splitlines()[0].rstrip('.')}; run parity on the CPU instead (runtime.strategy=cpu "
            "runtime.cpu_devices=8)"
        ) from None


def dropout_off(model) -> int:
    """Switches off every layer of NOISE_LAYERS in `model` (before the step is traced): sets its
    rate, GaussianNoise's stddev, a recurrent cell's dropout and recurrent_dropout (the cells of
    LSTM, GRU and SimpleRNN layers, Bidirectional or not, are among `layers_of(model)`) or an
    attention layer's dropout to 0; returns how many were on."""
    found = 0
    for layer in layers_of(model):
        for kind, attributes in NOISE_LAYERS:
            on = [attribute for attribute in attributes if getattr(layer, attribute)] if isinstance(layer, kind) else []
            for attribute in on:
                setattr(layer, attribute, 0.0)
            found += bool(on)
    return found


def random_layers(model) -> list[str]:
    """Where `model`'s traced training step draws random numbers (RANDOM_OPS): 'layer (op types)' for
    the innermost layer whose name scope holds each such op, or the op's name outside any layer. Left
    out: the layers `dropout_off` switched off (GaussianNoise still draws, and adds 0 times it; the
    others draw nothing at 0), and recomputed blocks, whose draw only seeds their Dropout masks."""
    layers = layers_of(model)
    names = {layer.name for layer in layers}
    left_out = {layer.name for layer in layers if isinstance(layer, recompute.Recomputed) or switched_off(layer)}
    # Naming only: the traced functions are read through a private method that may change.
    traced = getattr(model.train_function, "_list_all_concrete_functions", lambda: [])()
    found: dict[str, set[str]] = {}
    for function in traced:
        graph = function.graph.as_graph_def()
        # The step's own nodes and those of the functions it calls (loop bodies, nested calls).
        nodes = [*graph.node, *(node for library in graph.library.function for node in library.node_def)]
        for node in (node for node in nodes if node.op in RANDOM_OPS):
            # A name scope entered twice in one graph gets _1, _2, ...: a layer called twice.
            scopes = [scope if scope in names else re.sub(r"_\d+$", "", scope) for scope in node.name.split("/")[:-1]]
            layer = next((scope for scope in reversed(scopes) if scope in names), None)
            if layer in left_out:
                continue
            if layer is None:
                where = f"outside the layers: {node.name}"
            else:
                where = f"{layer}, in the model's own call" if layer == model.name else layer
            found.setdefault(where, set()).add(node.op)
    return [f"{where} ({', '.join(sorted(ops))})" for where, ops in found.items()]


def unsynchronised_norms(model) -> list[str]:
    """The names of the BatchNormalization layers that normalise per replica."""
    return [
        layer.name
        for layer in layers_of(model)
        if isinstance(layer, keras.layers.BatchNormalization) and not getattr(layer, "synchronized", False)
    ]


def start(make_model: Callable, strategy, initial: list) -> tuple[object, list, list]:
    """(`make_model()` under `strategy` with `initial` weights, the initial values of its trainable
    weights, those of its optimizer's variables, made here rather than in the first step so that
    `replay` can restore them)."""
    with strategy.scope():
        model = make_model()
        model.set_weights(initial)
        model.optimizer.build(model.trainable_variables)
    trainable = [variable.numpy() for variable in model.trainable_weights]
    return model, trainable, [variable.numpy() for variable in model.optimizer.variables]


def train_curve(make_model: Callable, strategy, initial: list, batches: list) -> tuple[list[float], float, object]:
    """(the loss of each batch trained in order, the inference loss of the first batch before any update,
    the model) from `initial` weights under `strategy`."""
    model, _, _ = start(make_model, strategy, initial)
    return (*curve(model, batches), model)


def curve(model, batches: list) -> tuple[list[float], float]:
    """(the loss of each batch trained in order, the inference loss of the first batch before any update)."""
    features, targets = batches[0]
    inference = float(model.test_on_batch(features, targets, return_dict=True)["loss"])
    return [float(model.train_on_batch(x, y, return_dict=True)["loss"]) for x, y in batches], inference


def replay(model, trainable_start: list, optimizer_start: list, batches: list) -> list[float]:
    """The training losses of `batches` again on a trained `model`, its trainable weights and
    optimizer state reset to `trainable_start` and `optimizer_start` (from `start`): the same traced
    step on the same numbers, while the state of its random ops and generators carries on, and so
    does the rest of the model's state, its non-trainable weights: restored, a counter that seeds
    stateless noise would replay the same draws. Training-mode losses read no other non-trainable
    weight (BatchNormalization normalises by the batch's own statistics, not its moving ones).
    Repeats the first losses unless the step draws random numbers."""
    for variable, value in zip(model.trainable_weights, trainable_start):
        variable.assign(value)
    for variable, value in zip(model.optimizer.variables, optimizer_start):
        variable.assign(value)
    return [float(model.train_on_batch(x, y, return_dict=True)["loss"]) for x, y in batches]


def reversed_rows(batches: list) -> list:
    """`batches` with the examples (rows) of each in reverse order."""
    return [tf.nest.map_structure(lambda array: array[::-1], batch) for batch in batches]


def rotated_rows(batches: list) -> list:
    """`batches` with the second half of each one's examples (rows) first."""
    return [tf.nest.map_structure(lambda array: np.roll(array, -(len(array) // 2), axis=0), batch) for batch in batches]


def compare(make_model: Callable, batches: list, one, replicated, tolerance: float | None = None) -> Curves:
    """Trains `make_model()` (compiled, dropout already off) on `batches` ([(features, targets)] of
    the global batch, numpy) from the same initial weights under the strategies `one` and `replicated`;
    the one-device model trains on them once more from the same start (`replay`), which tells whether
    the step draws random numbers (and then where: `random_layers`), and twice more with each batch's
    examples reversed and with its halves swapped, which measures what summation order moves the loss
    by (`Curves.order`).
    `tolerance`: a fixed bound instead of that."""
    with one.scope():
        reference = make_model()
    initial = reference.get_weights()
    model, trainable_start, optimizer_start = start(make_model, one, initial)
    one_losses, one_inference = curve(model, batches)
    replayed = replay(model, trainable_start, optimizer_start, batches)
    reordered = replay(model, trainable_start, optimizer_start, reversed_rows(batches))
    rotated = replay(model, trainable_start, optimizer_start, rotated_rows(batches))
    losses, inference, _ = train_curve(make_model, replicated, initial, batches)
    curves = Curves(
        replicated.num_replicas_in_sync,
        one_losses,
        losses,
        one_inference,
        inference,
        tolerance,
        unsynchronised_norms(model),
        initial,
        replayed,
        reordered=reordered,
        rotated=rotated,
        step_loss=getattr(model, "step_loss", None) is not None,
    )
    if curves.draws_random_numbers:
        curves.random_layers = random_layers(model)
    return curves


def global_batches(cfg: config_lib.Config, task, manifest: dict, steps: int) -> list:
    """`steps` global batches of the train split as numpy (features, targets), augmented once."""
    files, examples_per_file = input_pipeline.split_files(cfg.data.dir, manifest, "train")
    dataset = input_pipeline.train_pipeline(
        files,
        examples_per_file,
        task,
        manifest,
        cfg.train.global_batch_size,
        seed=cfg.runtime.seed,
        shuffle_buffer=cfg.data.shuffle_buffer,
        compression=manifest.get("compression", "none"),
        data_config=cfg.data,
    )
    return [tf.nest.map_structure(lambda tensor: tensor.numpy(), batch) for batch in dataset.take(steps)]


def report(curves: Curves, synchronised: Curves | None, mixed: list[float] | None, chosen: str) -> list[str]:
    lines = [f"{'step':>4}  {'one device':>10}  {f'{curves.replicas} replicas':>11}  {'difference':>10}"]
    parting = None if curves.draws_random_numbers else curves.parting_step
    for step, (a, b) in enumerate(zip(curves.one_device, curves.replicated)):
        mark = "  <- the curves part here" if step == parting else ""
        lines.append(f"{step:>4}  {a:>10.5f}  {b:>11.5f}  {curves.relative(a, b):>10.2e}{mark}")
    if curves.replayed:
        lines.append(
            f"noise floor: the same {len(curves.replayed)} steps again on one device from the same weights: largest "
            f"difference {curves.noise:.1e} (float32 rounding: within {ROUNDING:.1e}"
            + ("; TensorFlow's op determinism on: GPU kernels sum in one order)" if curves.op_determinism else ")")
        )
    if curves.reordered and not curves.draws_random_numbers:
        lines.append(
            f"summation order: the same {len(curves.reordered)} steps on one device with each batch's examples "
            f"reversed, and with its halves swapped: largest difference {curves.order:.1e}"
        )
    if curves.draws_random_numbers:
        lines.append("verdict: none: the model draws random numbers in training, so the curves differ by chance:")
        lines.append(f"  - {curves.randomness()}")
    elif parting is None:
        worst = max(curves.relative(a, b) for a, b in zip(curves.one_device, curves.replicated))
        lines.append(
            f"verdict: agree: {curves.replicas} replicas train as one device does (largest difference "
            f"{worst:.1e}, within {curves.bound_text()})"
        )
    else:
        lines.append(
            f"verdict: the curves part at step {parting} (difference "
            f"{curves.relative(curves.one_device[parting], curves.replicated[parting]):.1e}, beyond "
            f"{curves.bound_text()}), because:"
        )
        lines += [f"  - {cause}" for cause in curves.causes(synchronised)]
    if mixed is None and chosen == "bfloat16":
        lines.append("precision: not measured: random numbers in training would hide what mixed_bfloat16 moves")
    elif mixed is None:
        lines.append(f"precision: this run trains in {chosen}; the comparison above is that precision")
    else:
        drift = max(curves.relative(a, b) for a, b in zip(curves.one_device, mixed))
        lines.append(
            f"precision: on one device, mixed_bfloat16 moves the loss by {drift:.1e} at most against float32 over "
            f"{len(mixed)} steps (bfloat16 keeps 8 bits of mantissa: differences of 1e-3 to 1e-2 are its rounding, "
            "not a fault)"
        )
    return lines


def out_of_memory(cfg: config_lib.Config, task, manifest: dict, target, error: Exception) -> str:
    """One line for parity running out of device memory: the one-device side trains the whole global
    batch on one replica's memory in float32, so it needs far more than a replica of the run; the
    estimate of that (core/memory.py), and the same check with a global batch that one replica holds
    (any batch of at least one example per replica shows an objective that depends on the split)."""
    batch, replicas = cfg.train.global_batch_size, target.replicas
    smaller = max(replicas, batch // replicas // replicas * replicas)
    hbm = levers.replica_hbm_bytes(target)
    float32 = dataclasses.replace(cfg, runtime=dataclasses.replace(cfg.runtime, mixed_precision="float32"))
    try:
        plan = memory.estimate_for(float32, task, manifest, batch, hbm)
        estimate = f"that needs about {memory.gib(plan.total)} ({plan.breakdown()})"
        if hbm:
            estimate += f" of a replica's {memory.gib(hbm)} HBM"
    except Exception as failure:  # noqa: BLE001 - the estimate is a help; the error is the news
        estimate = f"no estimate ({type(failure).__name__})"
    return (
        f"out of device memory in parity ({levers.first_line(error)}); its one-device side trains each global "
        f"batch of {batch} examples on one replica's memory in float32: {estimate}; check with a global batch "
        f"that one replica holds: make parity ARGS=train.global_batch_size={smaller}"
    )


@contextlib.contextmanager
def out_of_memory_reported(cfg: config_lib.Config, task, manifest: dict, target):
    """Running out of device memory inside the block is `out_of_memory`'s one line (a UserError)."""
    try:
        yield
    except tf.errors.ResourceExhaustedError as error:
        raise UserError(out_of_memory(cfg, task, manifest, target, error)) from None


def main(argv: Sequence[str] | None = None) -> int:
    def add_arguments(parser):
        parser.add_argument("--steps", type=int, default=6, help="global batches to train on each side")
        parser.add_argument(
            "--tolerance",
            type=float,
            default=None,
            help="relative loss difference allowed (default: what float32 summation order explains, measured)",
        )

    cfg, args = config_lib.command_line(__doc__.split("\n\n")[0], argv, add_arguments, registry=tasks)
    task = tasks.load(cfg.task)
    # Each side's model traces its own step functions: TensorFlow's retracing warning says nothing here.
    tf.get_logger().setLevel(logging.ERROR)
    if args.steps < 1:
        raise UserError(f"--steps must be at least 1, got {args.steps}")
    target = distribute.resolve(cfg.runtime)
    if target.replicas == 1:
        raise UserError(
            "parity compares one device with several replicas, and this target has 1; on a CPU use "
            "runtime.cpu_devices=8 (what `make parity` passes)"
        )
    target.per_replica_batch_size(cfg.train.global_batch_size)
    keras.utils.set_random_seed(cfg.runtime.seed)  # the initial weights: the same command, the same verdict
    determinism = deterministic_gpu(target, cfg.runtime.seed)
    manifest = input_pipeline.read_manifest(cfg.data.dir, task, cfg.data)
    chosen = precision.choose(cfg.runtime.mixed_precision, target.kind).precision
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, gradient_accumulation_steps=1))
    batches = global_batches(cfg, task, manifest, args.steps)
    off = []

    def make_model():
        model = build_model(cfg, task, manifest)
        off.append(dropout_off(model))
        return compile_model(model, cfg, task, manifest, 1)

    print(
        f"parity: {args.steps} global batches of {cfg.train.global_batch_size} from the same initial weights on one "
        f"device and on {target.replicas} replicas ({target.kind}), float32, task {task.name}",
        flush=True,
    )
    precision.set_policy("float32")
    with out_of_memory_reported(cfg, task, manifest, target), deterministic_kernels(determinism):
        curves = compare(make_model, batches, single_device(target), target.strategy, args.tolerance)
    curves.op_determinism = determinism
    if off[0]:
        print(
            f"dropout off in both runs ({off[0]} Dropout, noise, recurrent-cell and attention layers): their random "
            "numbers differ per device",
            flush=True,
        )
    synchronised = None
    if curves.parting_step is not None and curves.unsynchronised_norms and not curves.draws_random_numbers:

        def make_synchronised():
            model = make_model()
            synchronise_norms(model)
            return model

        with out_of_memory_reported(cfg, task, manifest, target), deterministic_kernels(determinism):
            synchronised = compare(make_synchronised, batches, single_device(target), target.strategy, args.tolerance)
    mixed = None
    # The run's own precision, from the same weights on one device (random numbers would hide its effect).
    if chosen == "bfloat16" and not curves.draws_random_numbers:
        precision.set_policy("bfloat16")
        with out_of_memory_reported(cfg, task, manifest, target), deterministic_kernels(determinism):
            mixed, _, _ = train_curve(make_model, single_device(target), curves.initial, batches)
    for line in report(curves, synchronised, mixed, chosen):
        print(line, flush=True)
    if curves.draws_random_numbers:
        return 1
    return 0 if curves.parting_step is None or curves.only_norms(synchronised) else 1


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
