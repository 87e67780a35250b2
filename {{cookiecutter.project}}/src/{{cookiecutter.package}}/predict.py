"""Predictions from a run's export: what the task serves for each input (the classifiers: the label
and its probability), one line each, the input's name last.

    python -m {{ cookiecutter.package }}.predict --run runs/local INPUT...      # make predict INPUT="..."

Works from RUN/export alone (a SavedModel plus assets.extra/: the manifest and what the task
needs, e.g. its tokenizer), so an export copied to another machine still predicts.
What an INPUT is depends on the task: the task's `predict_inputs` reads it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from .core import distribute, gcp, native_logs
from . import tasks
from .core.errors import UserError, run_cli


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


def predict(run_dir: str, inputs: Sequence[str]) -> list[tuple[str, dict]]:
    """(input name, what the task serves for it as {field: value}) for every example in `inputs`."""
    import tensorflow as tf

    serve, manifest, export_dir = load_export(run_dir)
    task = tasks.load(manifest["task"], f"(the task of {export_dir})")
    names, batch = task.predict_inputs(inputs, manifest, export_dir)
    tensors = tf.nest.map_structure(tf.constant, batch)
    # A signature of several inputs takes them by name (the task's batch is then a dict of them).
    # The first call runs TensorFlow's graph passes, whose oneDNN notice about a type (int32, bool) is left out.
    with native_logs.without_lines(native_logs.ONEDNN_TYPE_NOTICE):
        served = serve(**tensors) if isinstance(tensors, dict) else serve(tensors)
    outputs = {key: value.numpy() for key, value in served.items()}
    return list(zip(names, task.predictions(batch, outputs, manifest, export_dir)))


def line(name: str, fields: dict) -> str:
    """One printed prediction: the fields tab-separated (floats with 3 decimals), the input's name last."""
    values = [f"{value:.3f}" if isinstance(value, float) else str(value) for value in fields.values()]
    return "\t".join([*values, name])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="run directory (runtime.output_dir) holding export/")
    parser.add_argument("inputs", nargs="*", help="the inputs to predict for")
    args = parser.parse_args(argv)
    if not args.inputs:
        raise UserError('no input given; pass the files to predict for, e.g. make predict INPUT="path ..."')
    gcp.require_credentials({"--run": args.run})
    distribute.physical_devices()  # TensorFlow's first look at the devices, without the no-GPU noise
    for name, fields in predict(args.run, args.inputs):
        print(line(name, fields))
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
