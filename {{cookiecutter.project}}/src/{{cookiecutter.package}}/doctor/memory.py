"""`make doctor` rule: will the model fit a chip ("Reducing memory usage" of the Cloud TPU
troubleshooting guide)? The estimate is core/memory.py's; the levers are config keys."""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from ..core import memory, precision, topology as topology_lib
from .engine import Context, Verdict, fail, not_on_a_tpu, passed, skip, tasks, warn

# The smallest per-replica batch a lever may go down to: XLA tiles the batch dimension by 8.
SMALLEST_BATCH = 8


class Planner:
    """Plans of the config with levers applied, for one replica of `hbm` bytes: the model is built
    (on the CPU) and traced once per remat setting and precision."""

    def __init__(self, ctx: Context, hbm: int):
        self.cfg, self.hbm, self.replicas = ctx.cfg, hbm, ctx.target.replicas
        self.precision = precision.choose(ctx.cfg.runtime.mixed_precision, ctx.target.kind).precision
        self.manifest = ctx.manifest or tasks.current().nominal_manifest(ctx.cfg.data)
        self.models: dict = {}
        self.traces: dict = {}

    def model(self, remat, precision_name: str):
        key = (remat, precision_name)
        if key not in self.models:
            model_config = self.cfg.model if remat is None else dataclasses.replace(self.cfg.model, remat=remat)
            policy = "mixed_bfloat16" if precision_name == "bfloat16" else "float32"
            with tf.device("/cpu:0"), precision.policy(policy):
                self.models[key] = tasks.current().build_model(model_config, self.manifest)
        return self.models[key]

    def plan(self, *, remat=None, optimizer=None, accumulation=1, precision_name=None) -> memory.Plan:
        train, precision_name = self.cfg.train, precision_name or self.precision
        batch = train.global_batch_size // self.replicas // accumulation
        model = self.model(remat, precision_name)
        key = (remat, precision_name)
        if key not in self.traces:  # activations scale with the batch: one trace serves every batch
            self.traces[key] = memory.trace(model, batch)
        trainable = [tuple(int(dim) for dim in weight.shape) for weight in model.trainable_weights]
        return memory.plan(
            self.traces[key],
            [tuple(int(dim) for dim in weight.shape) for weight in model.weights],
            trainable,
            per_replica_batch=batch,
            optimizer=optimizer or train.optimizer,
            momentum=train.momentum,
            accumulation_steps=accumulation * train.gradient_accumulation_steps,
            hbm=self.hbm,
        )


def _levers(planner: Planner) -> tuple[list[str], str]:
    """Each lever's effect alone, and the first combination that fits (or why none does)."""
    cfg, lines, applied, kwargs = planner.cfg, [], [], {}
    per_replica = cfg.train.global_batch_size // planner.replicas
    candidates = []
    if hasattr(cfg.model, "remat") and not cfg.model.remat:
        candidates.append(("model.remat=true", {"remat": True}))
    if cfg.train.optimizer != "adafactor":
        candidates.append(("train.optimizer=adafactor", {"optimizer": "adafactor"}))
    if planner.precision == "float32":
        candidates.append(("runtime.mixed_precision=bfloat16", {"precision_name": "bfloat16"}))
    for name, change in candidates:
        lines.append(f"{name}: {memory.gib(planner.plan(**change).total)}")
    accumulation = 1
    while True:
        plan = planner.plan(accumulation=accumulation, **kwargs)
        if plan.fits():
            break
        if candidates:
            name, change = candidates.pop(0)
            applied.append(name)
            kwargs.update(change)
            continue
        if per_replica // (accumulation * 2) < SMALLEST_BATCH or per_replica % (accumulation * 2):
            break
        accumulation *= 2
    if accumulation > 1:
        k = accumulation * cfg.train.gradient_accumulation_steps
        batch = cfg.train.global_batch_size // accumulation
        lines.append(
            f"train.global_batch_size={batch} train.gradient_accumulation_steps={k} (the same effective batch): "
            f"{memory.gib(planner.plan(accumulation=accumulation).total)}"
        )
        applied.append(f"train.global_batch_size={batch} train.gradient_accumulation_steps={k}")
    if plan.fits():
        together = f"with {' '.join(applied)}: {memory.gib(plan.total)}, fits"
    else:
        why = (
            f"the weights, gradients and optimizer slots alone take {memory.gib(plan.state)}: a smaller model"
            if plan.state > plan.usable
            else f"{per_replica // accumulation} examples per replica keep {memory.gib(plan.activations)} of "
            "activations: a smaller model or shorter inputs"
        )
        together = (
            f"with every lever ({' '.join(applied) or 'none left'}) still {memory.gib(plan.total)}: it cannot fit "
            f"one chip with data parallelism; {why}, or model parallelism (README: Model parallelism)"
        )
    return lines, together


def verdict(ctx: Context) -> Verdict:
    """The `model.memory` rule (registered in model.py, in the model topic's order)."""
    if ctx.layers is None:
        return skip("the model did not build (see model.build)")
    if ctx.per_replica_batch is None:
        return skip("the global batch does not divide (see batch.divisible)")
    if skipped := not_on_a_tpu(ctx, "HBM applies", "plans the TPU's memory"):
        return skipped
    chip = topology_lib.chip(ctx.target.tpu_type)
    planner = Planner(ctx, chip.replica_hbm_bytes)
    plan = planner.plan()
    per_chip, generation = chip.replicas, ctx.target.tpu_type.split("-")[0]
    found = (
        f"{memory.gib(plan.total * per_chip)} of {memory.gib(chip.hbm_bytes)} HBM per {generation} "
        f"chip at {ctx.per_replica_batch} examples per replica ({plan.breakdown()}"
        + (f", per TensorCore x{per_chip}" if per_chip > 1 else "")
        + f"); {memory.XLA_RESERVE:.0%} is left to XLA's own buffers"
    )
    if plan.total <= memory.WARN_SHARE * plan.usable:
        return passed(found)
    lines, together = _levers(planner)
    fix = "; ".join(lines + [together])
    if plan.fits():
        return warn(found + ": close to the limit, and the estimate is not exact", fix)
    return fail(found + ": does not fit", fix)
