"""Where a run's wall time goes, over every start of it: the `goodput` record in metrics.json.

A run on preemptible machines starts many times. Each start pays its start-up again (the strategy,
building the model, restoring the checkpoint, compiling the training step) and may repeat the
steps it had trained after its last checkpoint. Each start is recorded as it goes (at every log
line, so a start killed without notice still leaves its progress) and the summary is derived from
the list of starts:

- `phase_seconds`: the wall seconds of each phase, summed over the starts; `checkpoint` is the
  time checkpoint saves held the step loop (all of a save's write when synchronous; the copy to
  host memory and any wait for the previous save when written in the background)
- `repeated_steps`: steps a start trained beyond the checkpoint the next start resumed from
- `productive_seconds`: training seconds of the steps that were kept (not repeated later)
- `productive_share`: productive_seconds / wall_seconds
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable

# The phases of a start, by the names metrics.json records them under. Code names them only
# through these constants, so a misspelt phase is a NameError, not a phase silently left out of
# the time to first step.
STRATEGY = "strategy"
DATA_CHECK = "data check"
START_UP = "start-up"
MODEL_BUILD = "model build"
RESTORE = "restore"
CALIBRATION = "calibration"
FIRST_EXECUTION = "first execution"
TRAINING = "training"
CHECKPOINT = "checkpoint"
"""Seconds checkpoint saves held the step loop, booked out of training."""
EVALUATION = "evaluation"
END_OF_FIT = "end of fit"
EXPORT = "export"
REPEATED_STEPS = "repeated steps"
"""Not a phase of the clock: training time spent on steps that a later start trained again."""

# The phases before a start's first step, in the order they happen.
BEFORE_FIRST_STEP = (STRATEGY, DATA_CHECK, START_UP, MODEL_BUILD, RESTORE, CALIBRATION, FIRST_EXECUTION)
# Every phase, in the order a start goes through them (the order of the timings line).
PHASES = (
    START_UP,
    STRATEGY,
    DATA_CHECK,
    MODEL_BUILD,
    RESTORE,
    CALIBRATION,
    FIRST_EXECUTION,
    TRAINING,
    CHECKPOINT,
    EVALUATION,
    END_OF_FIT,
    EXPORT,
)

# What to change when a phase dominates; `{spe}` is the steps_per_execution the run used.
FIXES = {
    CALIBRATION: "set train.steps_per_execution={spe} (the calibrated value) to skip the measurement",
    FIRST_EXECUTION: "the training step's compilation is paid at every start: restart less often, or "
    "shorten the compilation (a smaller model, fewer distinct shapes)",
    REPEATED_STEPS: "checkpoint more often (lower train.checkpoint_every): each restart repeats the steps "
    "after the last checkpoint",
    CHECKPOINT: "checkpoint saves hold training: write them in the background (train.async_checkpoint=true), "
    "less often (raise train.checkpoint_every: a background save still waits for the one before it), or "
    "to a runtime.output_dir in the VM's region",
    EVALUATION: "evaluate less often (raise train.eval_every) or on fewer examples",
    RESTORE: "restoring the checkpoint dominates: keep checkpoints in the VM's region, or fewer of them",
    MODEL_BUILD: "building the model dominates: check for Python loops building many layers",
    STRATEGY: "starting the strategy dominates: on a TPU this is the TPU system's initialisation",
    DATA_CHECK: "reading the manifest dominates: keep data.dir in the VM's region",
    EXPORT: "exporting the SavedModel dominates a short run: train longer per run",
    END_OF_FIT: "releasing the input iterators stalls: see the tf.data autotuning note in input_pipeline.py",
    START_UP: "the rest of the start-up (importing TensorFlow, precision, seeds, the run's config.yaml) dominates: "
    "check the Python environment's disk and the run directory's storage",
}
# How a start ended, as its entry in the record says; the next start reads the last one.
FINISHED = "finished"
STOPPED_EARLY = "stopped early"
PREEMPTED = "preempted"
NON_FINITE_LOSS = "non-finite loss"
RUNNING = "running"
"""Not an end: the start is still going, or it was killed without a word (SIGKILL, a hard stop)."""
DONE = (FINISHED, STOPPED_EARLY)
"""Ends after which the next start evaluates again instead of training further."""


class PhaseClock:
    """Wall-clock seconds of each phase of one start, printed at the end so that a stall shows in
    any log. Time outside any phase is start-up; `with clock.phase(name):` books the block to `name`
    (phases nest: the enclosing one resumes when the block ends)."""

    def __init__(self, now: Callable[[], float] = time.perf_counter, since: float | None = None):
        """`since`: when the start began, on `now`'s clock (the process's start, so that importing
        TensorFlow counts as start-up); by default, now."""
        self.seconds: dict[str, float] = {}
        self._open = [START_UP]
        self._now = now
        self._since = now() if since is None else since

    def _book(self) -> None:
        now = self._now()
        self.seconds[self._open[-1]] = self.seconds.get(self._open[-1], 0.0) + now - self._since
        self._since = now

    @contextlib.contextmanager
    def phase(self, name: str):
        self._book()
        self._open.append(name)
        try:
            yield
        finally:
            self._book()
            self._open.pop()

    def move(self, seconds: float, source: str, destination: str) -> None:
        """Re-books time measured inside one phase (periodic evaluation inside training)."""
        self.seconds[source] = self.seconds.get(source, 0.0) - seconds
        self.seconds[destination] = self.seconds.get(destination, 0.0) + seconds

    def move_all(self, source: str, destination: str) -> float:
        """Re-books all of `source`'s seconds so far (its open block included) to `destination`, e.g.
        the first execution out of training once it ends; returns them."""
        self._book()
        seconds = self.seconds.get(source, 0.0)
        self.move(seconds, source, destination)
        return seconds

    def so_far(self) -> dict[str, float]:
        """The seconds of each phase, the open ones up to now, in the order a start goes through them."""
        self._book()
        ordered = sorted(self.seconds, key=lambda name: PHASES.index(name) if name in PHASES else len(PHASES))
        return {name: round(self.seconds[name], 2) for name in ordered}

    def describe_first_step(self) -> str:
        seconds = self.so_far()
        parts = {name: seconds[name] for name in BEFORE_FIRST_STEP if seconds.get(name)}
        return f"time to first step {sum(parts.values()):.1f} s: " + ", ".join(
            f"{name} {value:.1f} s" for name, value in parts.items()
        )

    def report(self) -> str:
        return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.so_far().items())


class StartRecord:
    """This start's entry in the run record's `goodput`, written as it goes: `write(step, end)` puts
    it (its phases so far) beside the earlier starts' and writes the record (a RunRecord)."""

    def __init__(self, record, clock: PhaseClock, initial_step: int):
        self.record, self.clock = record, clock
        self.earlier = list(record.starts)
        self.entry = {"initial_step": initial_step, "furthest_step": initial_step, "end": RUNNING}

    def write(self, step: int, end: str = RUNNING) -> dict:
        self.entry.update(furthest_step=step, phase_seconds=self.clock.so_far(), end=end)
        summary = summarize([*self.earlier, self.entry])
        self.record.update(goodput=summary)
        self.record.write()
        return summary


def time_to_first_step(phase_seconds: dict) -> float:
    return sum(phase_seconds.get(name, 0.0) for name in BEFORE_FIRST_STEP)


def summarize(starts: list[dict]) -> dict:
    """The record for metrics.json: the starts themselves and their sums.

    Each start is {"initial_step", "furthest_step", "phase_seconds", "end"}: the step it resumed
    from, the last step it reached, the wall seconds of its phases so far, and how it ended
    (one of the ends above: `RUNNING` if it never said).
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
            productive += start["phase_seconds"].get(TRAINING, 0.0) * (trained - lost) / trained
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
    losses = {name: seconds for name, seconds in record["phase_seconds"].items() if name != TRAINING}
    losses[REPEATED_STEPS] = record["phase_seconds"].get(TRAINING, 0.0) - record["productive_seconds"]
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
