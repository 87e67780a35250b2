"""Where a run's wall time goes, over every start of it: the `goodput` record in metrics.json.

A run on preemptible machines starts many times. Each start pays its start-up again (the strategy,
building the model, restoring the checkpoint, compiling the training step) and may repeat the
steps it had trained after its last checkpoint. Each start is recorded as it goes (at every log
line, so a start killed without notice still leaves its progress) and the summary is derived from
the list of starts:

- `phase_seconds`: the wall seconds of each phase, summed over the starts
- `repeated_steps`: steps a start trained beyond the checkpoint the next start resumed from
- `productive_seconds`: training seconds of the steps that were kept (not repeated later)
- `productive_share`: productive_seconds / wall_seconds
"""

from __future__ import annotations

# The phases before a start's first step, in the order they happen.
BEFORE_FIRST_STEP = ("strategy", "data check", "start-up", "model build", "restore", "calibration", "first execution")

# What to change when a phase dominates; `{spe}` is the steps_per_execution the run used.
FIXES = {
    "calibration": "set train.steps_per_execution={spe} (the calibrated value) to skip the measurement",
    "first execution": "the training step's compilation is paid at every start: restart less often, or "
    "shorten the compilation (a smaller model, fewer distinct shapes)",
    "repeated steps": "checkpoint more often (lower train.checkpoint_every): each restart repeats the steps "
    "after the last checkpoint",
    "evaluation": "evaluate less often (raise train.eval_every) or on fewer examples",
    "restore": "restoring the checkpoint dominates: keep checkpoints in the VM's region, or fewer of them",
    "model build": "building the model dominates: check for Python loops building many layers",
    "strategy": "starting the strategy dominates: on a TPU this is the TPU system's initialisation",
    "data check": "reading the manifest dominates: keep data.dir in the VM's region",
    "export": "exporting the SavedModel dominates a short run: train longer per run",
    "end of fit": "releasing the input iterators stalls: see the tf.data autotuning note in input_pipeline.py",
    "start-up": "the rest of the start-up (precision, seeds, the run's config.yaml) dominates: check the run "
    "directory's storage",
}


def time_to_first_step(phase_seconds: dict) -> float:
    return sum(phase_seconds.get(name, 0.0) for name in BEFORE_FIRST_STEP)


def summarize(starts: list[dict]) -> dict:
    """The record for metrics.json: the starts themselves and their sums.

    Each start is {"initial_step", "furthest_step", "phase_seconds", "end"}: the step it resumed
    from, the last step it reached, the wall seconds of its phases so far, and how it ended
    ("finished", "preempted", or "running" if it never said).
    """
    phases: dict[str, float] = {}
    repeated = 0
    productive = 0.0
    for index, start in enumerate(starts):
        for name, seconds in start["phase_seconds"].items():
            phases[name] = phases.get(name, 0.0) + seconds
        trained = start["furthest_step"] - start["initial_step"]
        following = starts[index + 1]["initial_step"] if index + 1 < len(starts) else start["furthest_step"]
        lost = max(0, start["furthest_step"] - following)
        repeated += lost
        if trained > 0:
            productive += start["phase_seconds"].get("training", 0.0) * (trained - lost) / trained
    wall = sum(phases.values())
    return {
        "starts": len(starts),
        "wall_seconds": round(wall, 2),
        "phase_seconds": {name: round(seconds, 2) for name, seconds in phases.items()},
        "time_to_first_step_seconds": [round(time_to_first_step(start["phase_seconds"]), 2) for start in starts],
        "repeated_steps": repeated,
        "productive_seconds": round(productive, 2),
        "productive_share": round(productive / wall, 4) if wall > 0 else 0.0,
        "per_start": starts,
    }


def largest_loss(record: dict) -> tuple[str, float]:
    """(the phase, or "repeated steps", that costs the most wall time besides productive training,
    its share of the wall time)."""
    losses = {name: seconds for name, seconds in record["phase_seconds"].items() if name != "training"}
    losses["repeated steps"] = record["phase_seconds"].get("training", 0.0) - record["productive_seconds"]
    name = max(losses, key=losses.get)
    wall = record["wall_seconds"]
    return name, (losses[name] / wall if wall > 0 else 0.0)


def describe(record: dict, steps_per_execution) -> str:
    """One line: the productive share and the largest loss with what to change."""
    name, share = largest_loss(record)
    starts = record["starts"]
    line = (
        f"goodput: {record['productive_share']:.0%} of {record['wall_seconds']:.0f} s wall time "
        f"over {starts} start{'s' if starts != 1 else ''} trained productively"
    )
    if record["repeated_steps"]:
        line += f", {record['repeated_steps']} steps repeated after restarts"
    fix = FIXES.get(name, "").format(spe=steps_per_execution)
    return f"{line}; largest loss: {name} {share:.0%}" + (f" ({fix})" if fix else "")
