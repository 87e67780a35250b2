"""`make doctor` rules: the training loop ("Host-device round trips", steps_per_execution)."""

from __future__ import annotations

from ..core import baselines
from ..core import config as config_lib
from ..core import goodput
from .engine import (
    PREEMPTION_GRACE_SECONDS,
    MIN_SPE_FOR_SHORT_STEPS,
    MIN_STEP_SECONDS,
    Context,
    Verdict,
    passed,
    rule,
    skip,
    warn,
    worst,
)


@rule("train.steps_per_execution")
def train_steps_per_execution(ctx: Context) -> Verdict:
    spe, history = ctx.cfg.train.steps_per_execution, ctx.history
    step = history.step_seconds
    measured = f"; the run in {ctx.cfg.runtime.output_dir} measured {step * 1000:.1f} ms per step" if step else ""
    if config_lib.is_auto(spe):
        chosen = f"; its last run chose {history.steps_per_execution}" if history.steps_per_execution else ""
        return passed(
            f"{spe}: measured once per setting among 1, 4, 16 ... up to min(log_every, checkpoint_every), "
            f"then reused{chosen}{measured}"
        )
    if spe == 1:
        return warn(
            "1 step per execution: every step pays a host-device round trip",
            "train.steps_per_execution=auto (or 32 and more for short steps)",
        )
    if step is not None and step < MIN_STEP_SECONDS and spe < MIN_SPE_FOR_SHORT_STEPS:
        return warn(
            f"{spe} steps per execution is too small against the measured step time{measured}",
            f"train.steps_per_execution={MIN_SPE_FOR_SHORT_STEPS} or auto",
        )
    return passed(f"{spe} steps per execution{measured}")


@rule("train.execution_boundaries")
def train_execution_boundaries(ctx: Context) -> Verdict:
    train = ctx.cfg.train
    spe = train.steps_per_execution
    if config_lib.is_auto(spe):
        return passed(f"{spe} stays within log_every={train.log_every} and checkpoint_every={train.checkpoint_every}")
    verdicts = []
    for key, every in (("log_every", train.log_every), ("checkpoint_every", train.checkpoint_every)):
        what = "logs" if key == "log_every" else "checkpoints"
        if spe > every:
            verdicts.append(
                warn(
                    f"steps_per_execution={spe} > {key}={every}: {what} happen only at execution "
                    f"boundaries, every {spe} steps",
                    f"train.steps_per_execution={every} or less (or auto)",
                )
            )
        elif every % spe:
            verdicts.append(
                passed(
                    f"{what} at the first execution boundary after every {every} steps ({spe} does not divide {every})"
                )
            )
    return (
        worst(*verdicts)
        if verdicts
        else passed(f"{spe} divides log_every={train.log_every} and checkpoint_every={train.checkpoint_every}")
    )


@rule("train.preemption_window")
def train_preemption_window(ctx: Context) -> Verdict:
    """A preemption notice is acted on at the end of the current execution, then a checkpoint is
    saved: both must fit in the grace period of a Spot TPU VM."""
    history = ctx.history
    step, save, spe = history.step_seconds, history.checkpoint_save_seconds, history.steps_per_execution
    if step is None or save is None or spe is None:
        return skip(f"no finished run in {ctx.cfg.runtime.output_dir} to take the step and save times from")
    needed = spe * step + save
    found = (
        f"the last run: {spe} steps x {step * 1000:.1f} ms + {save:.1f} s checkpoint save = {needed:.1f} s "
        f"from a notice to a saved exit"
    )
    if needed > PREEMPTION_GRACE_SECONDS:
        return warn(
            f"{found}, over the {PREEMPTION_GRACE_SECONDS} s a Spot TPU VM gets",
            f"train.max_seconds_per_execution={max(1, int(PREEMPTION_GRACE_SECONDS - save - 5))} "
            "(or a smaller train.steps_per_execution), and keep checkpoints on a fast bucket in the region",
        )
    return passed(f"{found} (within {PREEMPTION_GRACE_SECONDS} s)")


# One loss above this share of a run's wall time is worth a change of config.
GOODPUT_LOSS_SHARE = 0.25


@rule("train.goodput")
def train_goodput(ctx: Context) -> Verdict:
    """Where the last run's wall time went over all its starts: the largest loss besides productive
    training (calibration, compilation at every start, steps repeated after a restart, ...)."""
    record = ctx.history.goodput
    if not record:
        return skip(f"no run in {ctx.cfg.runtime.output_dir} with a goodput record in its metrics.json")
    name, share = goodput.largest_loss(record)
    summary = goodput.describe(record, ctx.history.steps_per_execution)
    if share > GOODPUT_LOSS_SHARE:
        starts = record["starts"]
        return warn(
            f"{name} is {share:.0%} of the last run's {record['wall_seconds']:.0f} s over {starts} "
            f"start{'s' if starts != 1 else ''} ({record['productive_share']:.0%} productive training)",
            goodput.FIXES.get(name, f"shorten {name}").format(spe=ctx.history.steps_per_execution),
        )
    return passed(summary)


@rule("train.baselines")
def train_baselines(ctx: Context) -> Verdict:
    """Whether the last run's final evaluation beat the best of the data's trivial baselines (the
    majority class, a bag-of-words model, an n-gram model, the train mean: `make preprocess` fits
    them), and what to try when it did not."""
    task, metrics = ctx.task, ctx.history.metrics
    headline, scores = task.headline_metric, metrics.get("baselines")
    if not isinstance(metrics.get(headline), (int, float)) or not isinstance(scores, dict) or not scores:
        return skip(
            f"no run in {ctx.cfg.runtime.output_dir} whose metrics.json has an eval {headline} and baselines "
            f"(they come from the manifest of a `make preprocess` of this version)"
        )
    found = {"scores": scores, "higher_is_better": task.higher_is_better}
    value, (name, _) = metrics[headline], baselines.best(found)
    facts = f"eval {headline} {value:.4f} at step {metrics.get('global_step')}; {baselines.describe(found)}"
    if baselines.beats(value, found):
        return passed(f"{facts}: beats the best, {name}")
    steps, rate = ctx.cfg.train.total_steps, ctx.cfg.train.base_learning_rate
    return warn(
        f"{facts}: the model does not beat the {name} baseline, a trivial model of the data",
        "on a real corpus start from configs/local-real.yaml (its budget); "
        f"train longer (train.total_steps={2 * steps}); try train.base_learning_rate={rate / 2:g} and {rate * 2:g}; "
        "compare the train and eval loss in TensorBoard (make tensorboard): far apart, regularise (dropout, "
        "train.weight_decay) or add data; close together, a larger model"
        + (f"; {task.baseline_advice}" if task.baseline_advice else ""),
    )
