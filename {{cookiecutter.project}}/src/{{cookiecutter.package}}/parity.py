"""Parity: does the model train on N replicas as it trains on one device?

    python -m {{ cookiecutter.package }}.parity --config configs/local.yaml [--steps 6] [--tolerance 1e-3] [dotted.key=value ...]

The Cloud TPU troubleshooting guide's check for an accuracy drop on many cores: the same initial
weights train the same `--steps` global batches (read once from the train split) on one device and
on every replica of the run's strategy, in float32 with dropout off (its random masks differ per
device), and the losses are compared step by step. It prints where they part and why:

- the same weights give another loss on the same batch in inference mode: the objective depends on
  how the batch is split (a batch-level loss, e.g. in-batch negatives, computed on each replica's
  share; gather it in the task's `step_loss`);
- they agree in inference mode but not in training mode: the model normalises over each replica's
  share of the batch (BatchNormalization that is not synchronised);
- they agree at first and drift apart: the optimizer amplifies summation-order differences beyond
  the tolerance (rare in float32; raise --tolerance to see how far);

and, separately, how far the run's own precision (mixed bfloat16) moves the one-device loss. It exits
with 0 when the curves agree, or part only by unsynchronised BatchNormalization (a choice: per-replica
statistics are the usual practice with a large per-replica batch); with 1 for any other cause. Gradient
accumulation is left out (1 micro-batch): what differs between 1 and N replicas is the split of each
batch, which it does not change.
"""

from __future__ import annotations

import dataclasses

import logging
import sys
from dataclasses import dataclass, field
from typing import Callable, Sequence

import tensorflow as tf

from . import tasks
from .core import config as config_lib
from .core import distribute, input_pipeline, precision
from .core.errors import UserError, run_cli
from .core.keras import keras
from .core.model import build_model, compile_model


@dataclass
class Curves:
    """The losses of the same batches from the same weights on one device and on N replicas."""

    replicas: int
    one_device: list[float]
    replicated: list[float]
    one_device_inference: float
    replicated_inference: float
    tolerance: float
    unsynchronised_norms: list[str] = field(default_factory=list)
    initial: list = field(default_factory=list, repr=False)
    """The initial weights both sides started from."""

    @staticmethod
    def relative(a: float, b: float) -> float:
        return abs(a - b) / max(abs(a), abs(b), 1e-12)

    @property
    def parting_step(self) -> int | None:
        """The first step whose losses differ by more than the tolerance; None when none does."""
        for step, (a, b) in enumerate(zip(self.one_device, self.replicated)):
            if self.relative(a, b) > self.tolerance:
                return step
        return None

    def causes(self, synchronised: "Curves | None" = None) -> list[str]:
        """Why the curves part, each cause one line (empty when they agree). `synchronised`: the same
        comparison with every BatchNormalization synchronised across replicas, when the model has
        unsynchronised ones (the experiment that tells whether they are the cause)."""
        step = self.parting_step
        if step is None:
            return []
        causes = []
        if self.relative(self.one_device_inference, self.replicated_inference) > self.tolerance:
            causes.append(
                "per-replica batch-level loss: the same weights give another loss on the same batch in inference "
                f"mode ({self.one_device_inference:.4f} on one device, {self.replicated_inference:.4f} on "
                f"{self.replicas} replicas), so the objective depends on how the batch is split; compute it over "
                "the global batch in the task's step_loss with core.model.gather (see Task.step_loss)"
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
                "gradients differ from the one device's beyond summation order (a layer that computes statistics "
                "over each replica's share of the batch, or an update that depends on the replica); raise "
                "--tolerance to see how far they drift"
            )
        return causes

    def only_norms(self, synchronised: "Curves | None") -> bool:
        """Whether the curves part only because of unsynchronised BatchNormalization: in inference
        mode the losses agree, and with the layers synchronised the curves agree."""
        return (
            synchronised is not None
            and synchronised.parting_step is None
            and self.relative(self.one_device_inference, self.replicated_inference) <= self.tolerance
        )


def synchronise_norms(model) -> None:
    """Makes every BatchNormalization compute its batch statistics over all replicas (before the
    step is traced; the variables stay the same)."""
    for layer in model.submodules:
        if isinstance(layer, keras.layers.BatchNormalization) and not getattr(layer, "synchronized", False):
            layer.synchronized, layer.fused = True, False


def single_device(target) -> tf.distribute.Strategy:
    """A one-replica strategy on the same kind of device as `target`."""
    if target.kind == "tpu":
        return distribute.one_tpu_core()
    if target.kind == "gpu":
        return tf.distribute.OneDeviceStrategy(tf.config.list_logical_devices("GPU")[0].name)
    return tf.distribute.OneDeviceStrategy(tf.config.list_logical_devices("CPU")[0].name)


def dropout_off(model) -> int:
    """Sets every Dropout layer's rate to 0 (before the step is traced); returns how many had one."""
    found = 0
    for layer in [model, *model.submodules]:
        if isinstance(layer, keras.layers.Dropout) and layer.rate:
            layer.rate = 0.0
            found += 1
    return found


def unsynchronised_norms(model) -> list[str]:
    """The names of the BatchNormalization layers that normalise per replica."""
    return [
        layer.name
        for layer in model.submodules
        if isinstance(layer, keras.layers.BatchNormalization) and not getattr(layer, "synchronized", False)
    ]


def train_curve(make_model: Callable, strategy, initial: list, batches: list) -> tuple[list[float], float, object]:
    """(the loss of each batch trained in order, the inference loss of the first batch before any update,
    the model) from `initial` weights under `strategy`."""
    with strategy.scope():
        model = make_model()
        model.set_weights(initial)
    features, targets = batches[0]
    inference = float(model.test_on_batch(features, targets, return_dict=True)["loss"])
    losses = [float(model.train_on_batch(x, y, return_dict=True)["loss"]) for x, y in batches]
    return losses, inference, model


def compare(make_model: Callable, batches: list, one, replicated, tolerance: float = 1e-3) -> Curves:
    """Trains `make_model()` (compiled, dropout already off) on `batches` ([(features, targets)] of
    the global batch, numpy) from the same initial weights under the strategies `one` and `replicated`."""
    with one.scope():
        reference = make_model()
    initial = reference.get_weights()
    one_losses, one_inference, model = train_curve(make_model, one, initial, batches)
    losses, inference, _ = train_curve(make_model, replicated, initial, batches)
    return Curves(
        replicated.num_replicas_in_sync,
        one_losses,
        losses,
        one_inference,
        inference,
        tolerance,
        unsynchronised_norms(model),
        initial,
    )


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
    )
    return [tf.nest.map_structure(lambda tensor: tensor.numpy(), batch) for batch in dataset.take(steps)]


def report(curves: Curves, synchronised: Curves | None, mixed: list[float] | None, chosen: str) -> list[str]:
    lines = [f"{'step':>4}  {'one device':>10}  {f'{curves.replicas} replicas':>11}  {'difference':>10}"]
    parting = curves.parting_step
    for step, (a, b) in enumerate(zip(curves.one_device, curves.replicated)):
        mark = "  <- the curves part here" if step == parting else ""
        lines.append(f"{step:>4}  {a:>10.5f}  {b:>11.5f}  {curves.relative(a, b):>10.2e}{mark}")
    if parting is None:
        worst = max(curves.relative(a, b) for a, b in zip(curves.one_device, curves.replicated))
        lines.append(
            f"verdict: agree: {curves.replicas} replicas train as one device does (largest difference "
            f"{worst:.1e} <= tolerance {curves.tolerance:g})"
        )
    else:
        lines.append(f"verdict: the curves part at step {parting}, because:")
        lines += [f"  - {cause}" for cause in curves.causes(synchronised)]
    if mixed is None:
        lines.append(f"precision: this run trains in {chosen}; the comparison above is that precision")
    else:
        drift = max(curves.relative(a, b) for a, b in zip(curves.one_device, mixed))
        lines.append(
            f"precision: on one device, mixed_bfloat16 moves the loss by {drift:.1e} at most against float32 over "
            f"{len(mixed)} steps (bfloat16 keeps 8 bits of mantissa: differences of 1e-3 to 1e-2 are its rounding, "
            "not a fault)"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    def add_arguments(parser):
        parser.add_argument("--steps", type=int, default=6, help="global batches to train on each side")
        parser.add_argument("--tolerance", type=float, default=1e-3, help="relative loss difference allowed")

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
            "runtime.cpu_devices=8 (the local configs' default)"
        )
    target.per_replica_batch_size(cfg.train.global_batch_size)
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
    curves = compare(make_model, batches, single_device(target), target.strategy, args.tolerance)
    if off[0]:
        print(f"dropout off in both runs ({off[0]} layers): its random masks differ per device", flush=True)
    synchronised = None
    if curves.parting_step is not None and curves.unsynchronised_norms:

        def make_synchronised():
            model = make_model()
            synchronise_norms(model)
            return model

        synchronised = compare(make_synchronised, batches, single_device(target), target.strategy, args.tolerance)
    mixed = None
    if chosen == "bfloat16":  # the run's own precision, from the same weights on one device
        precision.set_policy("bfloat16")
        mixed, _, _ = train_curve(make_model, single_device(target), curves.initial, batches)
    for line in report(curves, synchronised, mixed, chosen):
        print(line, flush=True)
    return 0 if curves.parting_step is None or curves.only_norms(synchronised) else 1


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
