"""Predictions from a run's export: the label and its probability for each input.

    python -m {{ cookiecutter.package }}.predict --run runs/local INPUT...      # make predict INPUT="..."

Works from RUN/export alone (a SavedModel plus assets.extra/: the label names, the manifest and
what the task needs, e.g. its tokenizer), so an export copied to another machine still predicts.
What an INPUT is depends on the task: the task's `predict_inputs` reads it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from . import gcp, tasks
from .errors import UserError, run_cli


def load_export(run_dir: str):
    """(the serving function, the label names, the manifest) of RUN_DIR/export."""
    import tensorflow as tf

    export_dir = f"{run_dir.rstrip('/')}/export"
    if not tf.io.gfile.exists(f"{export_dir}/saved_model.pb"):
        raise UserError(
            f"no SavedModel in {export_dir}; run `make train` first, or pass --run with the run "
            "directory (runtime.output_dir) of a finished training"
        )
    extra = f"{export_dir}/assets.extra"
    with tf.io.gfile.GFile(f"{extra}/labels.json") as handle:
        labels = json.load(handle)
    with tf.io.gfile.GFile(f"{extra}/manifest.json") as handle:
        manifest = json.load(handle)
    return tf.saved_model.load(export_dir).signatures["serving_default"], labels, manifest, export_dir


def predict(run_dir: str, inputs: Sequence[str]) -> list[tuple[str, str, float]]:
    """(input name, predicted label, its probability) for every example in `inputs`."""
    import tensorflow as tf

    serve, labels, manifest, export_dir = load_export(run_dir)
    names, batch = tasks.current().predict_inputs(inputs, export_dir, manifest)
    outputs = serve(tf.constant(batch))
    probabilities = outputs["probabilities"].numpy()
    classes = outputs["class"].numpy()
    return [
        (name, labels[index], float(probabilities[row, index])) for row, (name, index) in enumerate(zip(names, classes))
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="run directory (runtime.output_dir) holding export/")
    parser.add_argument("inputs", nargs="*", help="the inputs to classify")
    args = parser.parse_args(argv)
    if not args.inputs:
        raise UserError('no input given; pass files to classify, e.g. make predict INPUT="path ..."')
    gcp.require_credentials({"--run": args.run})
    for name, label, probability in predict(args.run, args.inputs):
        print(f"{label}\t{probability:.3f}\t{name}")
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
