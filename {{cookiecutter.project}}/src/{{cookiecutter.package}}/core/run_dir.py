"""The run directory (`runtime.output_dir`, local or gs://): its paths, its record and its export.

    config.yaml      the resolved config of the training that produced the checkpoints
    checkpoints/     numbered by step; checkpoints/best/ holds the best periodic evaluation's
    logs/            TensorBoard: train/, eval/, plugins/profile/
    metrics.json     the run record (`RunRecord`): evaluation, history, timings, goodput, calibration
    export/          the SavedModel and, in assets.extra/, what `predict` needs

metrics.json has exactly one writer, `RunRecord.write`: it is read once when a command starts,
updated in memory and written whole, atomically (see `write_atomically`), as are the records kept
in runtime.cache_dir (the steps_per_execution choices, the host's peak).

A checkpoint is whole once the `checkpoint` index file in checkpoints/ names it: TensorFlow writes
that file (atomically) after the checkpoint's own files, including for a checkpoint written in the
background (train.async_checkpoint; callbacks.save_checkpoint).
"""

from __future__ import annotations

import contextlib
import json
import uuid

import tensorflow as tf

from .errors import UserError

METRICS = "metrics.json"


def run_path(output_dir: str, *parts: str) -> str:
    return "/".join([output_dir.rstrip("/"), *parts])


def checkpoint_step(path: str) -> int:
    """The step a checkpoint was saved at: checkpoints are numbered by step (`ckpt-400`)."""
    return int(path.rsplit("-", 1)[1])


def latest_checkpoint(output_dir: str) -> str | None:
    return tf.train.latest_checkpoint(run_path(output_dir, "checkpoints"))


TEMPORARY = ".tmp-"
"""What `write_atomically` appends to a path for the temporary file it renames over it."""


def write_atomically(path: str, content: str) -> None:
    """Writes `path` so that a reader (or a process killed or out of disk mid-write) sees the old
    content or the new one, never a part: the content goes to a temporary file beside it, then
    replaces it. A failed write removes its temporary file.

    On a local disk the rename is atomic (POSIX rename(2)). On gs:// a rename is a copy then a
    delete, but Cloud Storage objects are replaced whole: the temporary object is complete before
    the copy starts, and the copy creates the new generation of `path` in one step. What gs:// does
    not give is the old-or-new guarantee for the temporary object: a killed writer may leave a
    stray `.tmp-*` object beside the record, which nothing reads.
    """
    temporary = f"{path}{TEMPORARY}{uuid.uuid4().hex[:8]}"
    try:
        with tf.io.gfile.GFile(temporary, "w") as handle:
            handle.write(content)
        tf.io.gfile.rename(temporary, path, overwrite=True)
    except BaseException:
        if tf.io.gfile.exists(temporary):
            tf.io.gfile.remove(temporary)
        raise


class RunRecord:
    """metrics.json: what a run reports about itself, over all its starts.

    Read once when created; `update` changes the record in memory and `write` puts it on disk whole.
    Keys written by one start and not renewed by the next (the calibration, the history, the
    goodput of earlier starts) are kept.
    """

    def __init__(self, output_dir: str):
        self.path = run_path(output_dir, METRICS)
        self.values: dict = self._read()

    def _read(self) -> dict:
        if not tf.io.gfile.exists(self.path):
            return {}
        with tf.io.gfile.GFile(self.path) as handle:
            text = handle.read()
        try:
            values = json.loads(text)
        except ValueError as error:
            raise UserError(
                f"{self.path} is not valid JSON ({error}); move it away to let this run write a new one"
            ) from None
        return values if isinstance(values, dict) else {}

    def get(self, key: str, default=None):
        return self.values.get(key, default)

    # The keys that more than one part of the project reads, by name.
    @property
    def starts(self) -> list[dict]:
        """Every start of the run, oldest first (goodput.py: its steps, phases and how it ended)."""
        return self.values.get("goodput", {}).get("per_start", [])

    @property
    def last_start(self) -> dict | None:
        """The newest start (its `end` says how it ended), or None for a new run."""
        return self.starts[-1] if self.starts else None

    @property
    def history(self) -> list[dict]:
        """The periodic evaluations: {"step", metric: value}."""
        return self.values.get("history", [])

    @property
    def calibration(self) -> dict | None:
        """The `steps_per_execution: auto` choice and its measurements (steps_per_execution.py)."""
        return self.values.get("calibration")

    @property
    def examples_per_second(self) -> float | None:
        """The training throughput the last start that trained measured."""
        return self.values.get("examples_per_second")

    def update(self, **values) -> None:
        self.values.update(values)

    def write(self) -> str:
        write_atomically(self.path, json.dumps(self.values, indent=2) + "\n")
        return self.path


def export(model, output_dir: str, manifest: dict, cfg, task) -> str:
    """A SavedModel with `task`'s serving signature (shaped by the config's `predict:` keys), and
    in its assets.extra/ what `predict` needs: the manifest and the task's assets (e.g. its tokenizer)."""
    path = run_path(output_dir, "export")
    options = tf.saved_model.SaveOptions(experimental_io_device="/job:localhost")
    signature = task.build_serving_signature(model, cfg.predict, cfg.objective, manifest)
    tf.saved_model.save(model, path, signatures={"serving_default": signature}, options=options)
    extra = run_path(path, "assets.extra")
    tf.io.gfile.makedirs(extra)
    files = {
        "manifest.json": json.dumps(manifest, indent=2).encode(),
        **task.export_assets(manifest, cfg.data.dir),
    }
    for name, content in files.items():
        with tf.io.gfile.GFile(run_path(extra, name), "wb") as handle:
            handle.write(content)
    return path


def restore_newest_readable(
    checkpoint: tf.train.Checkpoint, manager: tf.train.CheckpointManager, cursor=None
) -> str | None:
    """Restores the newest checkpoint that can be read; returns its path, or None for a fresh start.

    A save cut short (the VM stopped mid-write, a truncated file on a full disk) leaves a newest
    checkpoint that cannot be read: that is not fatal, the one before it is used, and the log says so.
    A checkpoint written before the input's cursor (`cursor`, the checkpoint's `input`) existed is
    restored without it: the cursor then reports nothing restored. One written before the model's
    random generators were saved (core/model.py) is restored without them, and the log says so.
    """
    for path in reversed(manager.checkpoints):
        try:
            names = [name for name, _ in tf.train.list_variables(path)]
            with_cursor = any(name.startswith(CURSOR) for name in names)
            generators = getattr(checkpoint.model, "random_generators", None)
            if generators and not any(name.startswith(GENERATORS) for name in names):
                with _left_out(checkpoint.model, "random_generators"):
                    _restore(checkpoint, path, cursor, with_cursor)
                print(
                    f"checkpoint {path} holds no random generators (written before they were saved): dropout "
                    "masks are drawn afresh from here",
                    flush=True,
                )
            else:
                _restore(checkpoint, path, cursor, with_cursor)
            return path
        except Exception as error:  # noqa: BLE001 - a cut-short file fails in many ways (OpError, IndexError, ...)
            detail = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
            print(
                f"checkpoint {path} cannot be read ({type(error).__name__}: {detail}); trying the one before",
                flush=True,
            )
    if manager.checkpoints:
        raise UserError(
            f"no checkpoint in {manager.directory} can be read; move the folder away to start afresh, "
            "or set runtime.output_dir to a new run directory"
        )
    return None


GENERATORS = "model/random_generators/"
"""Where a checkpoint keeps the state of the model's random generators (core/model.py)."""
CURSOR = "input/"
"""Where a checkpoint keeps the input's cursor (core/input_cursor.py)."""


def _restore(checkpoint: tf.train.Checkpoint, path: str, cursor, with_cursor: bool) -> None:
    if cursor is not None:
        cursor.restored = None
        if not with_cursor:
            tf.train.Checkpoint(model=checkpoint.model, optimizer=checkpoint.optimizer).restore(
                path
            ).assert_existing_objects_matched()
            return
    # Whatever the checkpoint holds beyond `checkpoint` (the input's cursor, for `make eval`) stays unread.
    checkpoint.restore(path).assert_existing_objects_matched().expect_partial()


@contextlib.contextmanager
def _left_out(model, attribute: str):
    """`model` without what its tracked list `attribute` holds, for the length of the block."""
    kept = list(getattr(model, attribute))
    setattr(model, attribute, [])
    try:
        yield
    finally:
        setattr(model, attribute, kept)
