"""Predictions from a run's export: what the task serves for each input (the classifiers: the label
and its probability), one line each, the input's name last.

    python -m {{ cookiecutter.package }}.predict --run runs/local INPUT...      # make predict INPUT="..."

Works from RUN/export alone (a SavedModel plus assets.extra/: the manifest and what the task
needs, e.g. its tokenizer), so an export copied to another machine still predicts.
What an INPUT is depends on the task: the task's `predict_inputs` reads it. The examples are served
`--batch` at a time (make predict PREDICT_BATCH=...); running out of device memory is one line that
says how many were served at once and what to pass instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from .core import distribute, gcp, levers, native_logs
from . import tasks
from .core.errors import UserError, run_cli


DEFAULT_BATCH = 64
"""Examples served at once by default: a chip's memory holds far more for the shipped models."""


def load_export(run_dir: str):
    """(the serving function, the manifest, the export's folder) of RUN_DIR/export."""
    import tensorflow as tf

    export_dir = f"{run_dir.rstrip('/')}/export"
    if not tf.io.gfile.exists(f"{export_dir}/saved_model.pb"):
        raise UserError(
            f"no SavedModel in {export_dir}; run `make train` first, or pass --run with the run "
            "directory (runtime.output_dir) of a finished training"
        )
    with tf.io.gfile.GFile(f"{export_dir}/assets.extra/manifest.json") as handle:
        manifest = json.load(handle)
    return tf.saved_model.load(export_dir).signatures["serving_default"], manifest, export_dir


def predict(run_dir: str, inputs: Sequence[str], batch_size: int = DEFAULT_BATCH) -> list[tuple[str, dict]]:
    """(input name, what the task serves for it as {field: value}) for every example in `inputs`,
    served `batch_size` examples at a time."""
    import numpy as np
    import tensorflow as tf

    serve, manifest, export_dir = load_export(run_dir)
    task = tasks.load(manifest["task"], f"(the task of {export_dir})")
    names, batch = task.predict_inputs(inputs, manifest, export_dir)
    served = []
    for start in range(0, len(names), batch_size):
        part = examples(batch, start, start + batch_size)
        try:
            # A signature of several inputs takes them by name (the task's batch is then a dict of them).
            # The first call runs TensorFlow's graph passes, whose oneDNN notice about a type is left out.
            with native_logs.without_lines(native_logs.ONEDNN_TYPE_NOTICE):
                outputs = serve(**part) if isinstance(part, dict) else serve(part)
        except tf.errors.ResourceExhaustedError as error:
            raise UserError(out_of_memory(int(tf.nest.flatten(part)[0].shape[0]), error)) from None
        served.append({key: value.numpy() for key, value in outputs.items()})
    outputs = {key: np.concatenate([part[key] for part in served]) for key in served[0]} if served else {}
    return list(zip(names, task.predictions(batch, outputs, manifest, export_dir)))


def examples(batch, start: int, stop: int):
    """Examples `start` to `stop` of a task's batch for the signature (an array, or a dict of them), as tensors."""
    import tensorflow as tf

    return tf.nest.map_structure(lambda array: tf.constant(array[start:stop]), batch)


def out_of_memory(served: int, error: Exception) -> str:
    """One line for serving that ran out of device memory: how many examples went at once, and fewer."""
    fewer = max(1, served // 4)
    return (
        f"out of device memory serving {served} examples at once ({levers.first_line(error)}); serve fewer at a "
        f"time: make predict PREDICT_BATCH={fewer} (python -m {__package__}.predict --batch {fewer})"
    )


def line(name: str, fields: dict) -> str:
    """One printed prediction: the fields tab-separated (floats with 3 decimals), the input's name last."""
    values = [f"{value:.3f}" if isinstance(value, float) else str(value) for value in fields.values()]
    return "\t".join([*values, name])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="run directory (runtime.output_dir) holding export/")
    parser.add_argument("inputs", nargs="*", help="the inputs to predict for")
    parser.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="examples served at once")
    args = parser.parse_args(argv)
    if not args.inputs:
        raise UserError('no input given; pass the files to predict for, e.g. make predict INPUT="path ..."')
    if args.batch < 1:
        raise UserError(f"--batch must be at least 1, got {args.batch} (make predict PREDICT_BATCH=...)")
    gcp.require_credentials({"--run": args.run})
    distribute.physical_devices()  # TensorFlow's first look at the devices, without the no-GPU noise
    for name, fields in predict(args.run, args.inputs, args.batch):
        print(line(name, fields))
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
