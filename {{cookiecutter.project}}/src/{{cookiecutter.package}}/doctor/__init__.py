"""`make doctor`: checks the config, the model, the data and the machine against the Cloud TPU
performance guide before any TPU time is spent.

    python -m {{ cookiecutter.package }}.doctor --config FILE [--tpu_type v4-32] [--target tpu] [dotted.key=value ...]

Every rule prints one line: PASS, WARN, FAIL or SKIP, what it found and, when it is not a PASS,
the fix; then a summary. The exit status is 1 when a rule FAILs (warnings alone exit 0) and 2
for an error in the command line or the config. Nothing here initialises an accelerator: the
model is built on the CPU only to list its layers, the input pipeline is built but never run,
and the TPU VM rules read device files, /proc and package metadata.

The replicas that the batch rules check against: the TPU topology of `--tpu_type` (default: the
type this project was generated for) when the config targets a TPU (`runtime.strategy=tpu`;
`auto` on a TPU VM or with a Pod slice in `runtime.tpu`; or `--target tpu` on the command
line), else `runtime.cpu_devices` (or the GPUs) of this machine.

The rules, by topic of the Cloud TPU performance guide (cloud.google.com/tpu/docs/performance-guide)
and its companion pages:

Batch size and tensor padding ("Batch size", "Tensor dimensions", "Padding"):
  batch.divisible           the global batch divides evenly across the replicas (FAIL: training refuses it)
  batch.multiple_of_8       the per-replica batch is a multiple of 8: XLA tiles the batch dimension by 8
                            and pads the rest with zeros
  batch.per_core_128        at least 128 examples per TPU core (1024 on 8 cores) to fill the MXU
Model ("Tensor dimensions", "Fully connected layers", "Batch normalization", "bfloat16"):
  model.build               the model builds (on the CPU) and has conv or dense layers to check
  model.feature_dims        Conv filters and hidden Dense units are multiples of 128 (of 8 when the global
                            batch is a multiple of 1024); the output layers (their width is the data's) are exempt
  model.narrow_layers       layers under 128 wide use a fraction of the 128x128 MXU
  model.hidden_dense        hidden Dense layers under 512 units are too small to keep the MXU busy
  model.batch_norm          per-replica batch under 32 with per-replica batch-norm statistics
  model.memory              the step's memory per TPU chip (weights, gradients, optimizer slots, activations
                            kept for the backward pass; core/memory.py) against the chip's HBM less XLA's
                            share; on WARN/FAIL each memory lever's effect and a combination that fits
  model.flops               the model FLOPs of one optimizer step (what the training log's TFLOP/s and MFU
                            divide) and the step time they take at the chips' peak: the fastest the step
                            can run
  model.init_from           train.init_from is a readable checkpoint whose weights match the config's model
                            (shapes, less what train.init_skip names) and whose run used the data's tokenizer
  model.precision           bfloat16 on a TPU (the MXU's native input type, half the memory traffic); on
                            a CPU, whether it computes bfloat16 natively (else emulated, several times slower)
Input pipeline ("Static shapes", "Input pipeline performance", "Storage"):
  input.static_shapes       the real training and eval datasets have fully defined shapes
                            (drop_remainder=True): a dynamic shape recompiles or fails on a TPU
  data.credentials          a gs:// data.dir or runtime.output_dir has Google Cloud credentials here (WARN
                            without: the rules that read those paths SKIP, every other rule runs)
  data.manifest             manifest.json is present, readable, and matches the task's feature spec and data.*
  data.shard_count          at least 10 shards per reading host, so every host interleaves several files
  data.shard_size           shards of 10 MB or more (100 MB+ ideally): per-file overhead otherwise dominates
  data.location             a multi-host slice reads gs://: each worker sees only its own local disk
  run.location              a multi-host slice writes checkpoints and logs to gs:// too
Training loop ("Host-device round trips", steps_per_execution of the TPU training loop):
  train.steps_per_execution several steps per call into the device, more when the step is short
  train.execution_boundaries logs and checkpoints happen only between executions
  train.goodput             the last run's wall time over all its starts: warns when one loss (calibration,
                            compilation, repeated steps, evaluation, ...) exceeds a quarter of it
The TPU type and its TensorFlow (core/support.py, README.md "Which TPU, which TensorFlow"):
  tpu.support               the support matrix's line for --tpu_type and the TensorFlow it runs there (the
                            installed one on a TPU VM, else the set `make setup` installs there): WARN where
                            no public source shows that TensorFlow on that TPU (TPU7x, v6e, newer than 2.19,
                            a Pod image Google does not document)
The TPU VM (TPU VM troubleshooting; SKIP anywhere else):
  tpu.devices               the TPU device files (/dev/accel*, /dev/vfio/<n>) are there
  tpu.software              tensorflow-tpu at the version of one of requirements.txt's TensorFlow sets, and
                            libtpu, are installed
  tpu.lock_file             no stale /tmp/libtpu_lockfile and no other process holding the chips
  tpu.log_dir               TPU_LOG_DIR is writable, so libtpu's own logs are not lost
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from .. import tasks
from ..core import config as config_lib
from ..core import gcp
from ..core import topology as topology_lib
from ..core.errors import UserError

# One module of rules per topic; each registers its rules on import.
from . import batch, data, model, tpu_vm, training  # noqa: F401
from .engine import FAIL, NOT_A_TPU_VM, RULES, Context, format_report, gpu_count, resolve_target, run_rules, summary

# The report follows the Cloud TPU guide: batch, model, input and data, the training loop, the VM.
TOPIC_ORDER = ("batch", "model", "input", "data", "run", "train", "tpu")
RULES.sort(key=lambda entry: TOPIC_ORDER.index(entry[0].split(".")[0]))


def _keep_tensorflow_off_the_accelerators() -> None:
    """Before TensorFlow is imported: no libtpu (it would take the TPU and its lock from a running
    job), no GPUs. Building the model and the input pipeline needs the CPU only."""
    if "tensorflow" in sys.modules:
        return
    os.environ["TPU_LOAD_LIBRARY"] = "0"
    for name in ("TF_PLUGGABLE_DEVICE_LIBRARY_PATH", "NEXT_PLUGGABLE_DEVICE_USE_C_API"):
        os.environ.pop(name, None)
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="YAML file under configs/")
    parser.add_argument(
        "--tpu_type",
        help=f"TPU type a TPU target has (default {topology_lib.DEFAULT_TPU_TYPE}; `make doctor` passes TPU_TYPE)",
    )
    parser.add_argument(
        "--target",
        choices=("auto", "tpu", "gpu", "cpu"),
        default="auto",
        help="where the config will train (default: from runtime.strategy and this machine)",
    )
    parser.add_argument("overrides", nargs="*", help="dotted.key=value, e.g. train.global_batch_size=1024")
    args = parser.parse_args(argv)
    cfg = config_lib.load(args.config, args.overrides, registry=tasks)
    task = tasks.load(cfg.task)
    # Without credentials the doctor still plans: the rules that read a gs:// path skip (data.credentials).
    try:
        credentials = gcp.require_credentials({"data.dir": cfg.data.dir, "runtime.output_dir": cfg.runtime.output_dir})
        no_credentials = ""
    except UserError as error:
        credentials, no_credentials = None, str(error)
    _keep_tensorflow_off_the_accelerators()
    from ..core import distribute

    distribute.physical_devices()  # TensorFlow's first look at the devices, without the no-GPU noise
    on_tpu_vm = distribute.on_tpu_vm()
    target = resolve_target(cfg, target=args.target, tpu_type=args.tpu_type, on_tpu_vm=on_tpu_vm, gpus=gpu_count())
    print(f"doctor: {args.config}{' ' + ' '.join(args.overrides) if args.overrides else ''}")
    print(f"target: {target.describe()}")
    print(f"machine: {'a TPU VM' if on_tpu_vm else NOT_A_TPU_VM}", flush=True)
    context = Context(cfg, task, target, on_tpu_vm=on_tpu_vm, tpu_type=args.tpu_type)
    context.credentials, context.no_credentials = credentials, no_credentials
    results = run_rules(context)
    print(format_report(results))
    print(summary(results))
    return 1 if any(result.status == FAIL for result in results) else 0
