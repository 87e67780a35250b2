"""`make doctor` rule: will the model fit a chip ("Reducing memory usage" of the Cloud TPU
troubleshooting guide)? The estimate is core/memory.py's, from shapes alone (nothing of the model
is allocated on this host, whatever its size); the levers are config keys (core/levers.py, the
table an out-of-memory error names too)."""

from __future__ import annotations

import math

from ..core import levers, memory, utilisation, topology as topology_lib
from .engine import Context, Verdict, fail, not_on_a_tpu, passed, skip, warn

# The smallest per-replica batch a lever may go down to: XLA tiles the batch dimension by 8.
SMALLEST_BATCH = 8


class Planner:
    """Plans of the config with levers applied, for one replica of `hbm` bytes (the context's
    memory planner: the model is built and traced once per remat setting and precision)."""

    def __init__(self, ctx: Context, hbm: int):
        self.cfg, self.hbm, self.replicas = ctx.cfg, hbm, ctx.target.replicas
        self.precision = ctx.precision
        self.planner = ctx.planner

    def plan(self, *, remat=None, optimizer=None, accumulation=1, precision_name=None) -> memory.Plan:
        batch = self.cfg.train.global_batch_size // self.replicas // accumulation
        return self.planner.plan(
            batch,
            self.hbm,
            precision_name=precision_name or self.precision,
            remat=remat,
            optimizer=optimizer,
            accumulation=accumulation,
        )


def _levers(planner: Planner) -> tuple[list[str], str]:
    """Each lever's effect alone, and the first combination that fits (or why none does)."""
    cfg, lines, applied, kwargs = planner.cfg, [], [], {}
    per_replica = cfg.train.global_batch_size // planner.replicas
    candidates = [(lever.setting, lever.change) for lever in levers.unused(cfg, planner.precision)]
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
        setting = levers.accumulation(cfg, accumulation)
        alone = planner.plan(accumulation=accumulation).total
        lines.append(f"{setting} (the same effective batch): {memory.gib(alone)}")
        applied.append(setting)
    if plan.fits():
        # Nothing applied: it fits as configured (a WARN close to the limit); each lever's line says what it frees.
        together = f"with {' '.join(applied)}: {memory.gib(plan.total)}, fits" if applied else ""
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
        + (f"; {memory.gib(plan.total)} of {memory.gib(plan.hbm)} per TensorCore, x{per_chip}" if per_chip > 1 else "")
        + f"); {memory.XLA_RESERVE:.0%} is left to XLA's own buffers"
    )
    judged = plan.verdict()
    if judged == "pass":
        return passed(found)
    lines, together = _levers(planner)
    fix = "; ".join(line for line in [*lines, together] if line) or "a smaller train.global_batch_size or model"
    if judged == "warn":
        return warn(found + ": close to the limit, and the estimate is not exact", fix)
    return fail(found + ": does not fit", fix)


def _four_digits(value: float) -> str:
    """`value` to 4 significant digits, without an exponent: 2,215 / 2.215 / 0.00002215."""
    decimals = max(0, 3 - math.floor(math.log10(abs(value)))) if value else 0
    return f"{value:,.{decimals}f}"


def flops_verdict(ctx: Context) -> Verdict:
    """The `model.flops` rule (registered in model.py): the model FLOPs of one optimizer step, as the
    training log counts them (`utilisation.step_flops`: 3 x the forward pass's matrix multiplies per
    example, times the examples of an update), from the memory plan's trace, and the step time they take at
    the target's peak: the fastest the step can run (at 100% MFU)."""
    if ctx.layers is None:
        return skip("the model did not build (see model.build)")
    if ctx.per_replica_batch is None:
        return skip("the global batch does not divide (see batch.divisible)")
    trace, _, _ = ctx.planner.traced(None, ctx.precision, ctx.per_replica_batch)
    if trace.unknown_flops:
        return passed(f"model FLOPs unknown: {'; '.join(trace.unknown_flops)}")
    cfg = ctx.cfg
    flops = trace.training_flops_per_example * cfg.effective_batch_size
    found = (
        f"{_four_digits(flops / 1e9)} GFLOP per optimizer step (3 x the forward pass's matrix multiplies "
        f"of {cfg.effective_batch_size} examples; not counted: the loss's own, remat's recomputation, element-wise ops)"
    )
    peak, source = utilisation.peak_per_chip(ctx.target, ctx.precision, cfg.runtime.cache_dir)
    if not peak:
        return passed(f"{found}; no step time at peak: {source}")
    chips = utilisation.chips(ctx.target)
    seconds = flops / (chips * peak)
    return passed(
        f"{found}: at least {_four_digits(seconds * 1e3)} ms a step at {peak / 1e12:.4g} TFLOP/s per chip "
        f"x {chips} chip{'s' if chips > 1 else ''} ({source}), the time at 100% MFU"
    )
