"""The library every command shares, by room. A room's modules import the rooms above it and each
other, never a room below (tests/test_layout.py holds the arrows one way, reading this map):

plumbing
    errors, native_logs    one-line user errors; TensorFlow's C++ log filter
    keras, gcp             the one Keras import; Cloud Storage credentials
    example_proto          tf.train.Example records without importing TensorFlow (Beam's workers)
contract
    config                 typed config: a base YAML + deltas + dotted.key=value overrides
    task                   the contract a task implements (tasks/ holds them)
platform
    topology, distribute   where it runs: TPU type, hosts, replicas; the strategy
    preemption, profiler   metadata notices; the profiler server
    tensorflow_sets        requirements.txt's TensorFlow sets: the default, the others, a TPU VM's
    support                which TensorFlow is known to run on which TPU, with the sources
data
    preprocessing          the Beam pipeline: raw files -> TFRecords + manifest
    baselines              the trivial baselines of the data, fitted at preprocessing
    input_pipeline         TFRecords -> static batches on every replica
    input_cursor           the train input's position in every checkpoint (exact resume)
    run_dir                the run directory: paths, metrics.json (RunRecord), checkpoints' restore, export
model
    precision, schedule    bfloat16 or float32; the learning rate
    model                  the task's network, compiled with optimizer, loss and metrics; a step
                           loss's global batch (gather) and global-batch mean (global_mean)
    optimizers, recompute  the optimizers (Adafactor's factored moments); recomputed blocks (model.remat)
    warm_start             another run's weights at a new run's start (train.init_from); frozen layers
    memory, levers         the step's memory plan and FLOPs from shapes; the memory levers and the
                           one line an out-of-memory error becomes
loop
    trainer                one start of a run, step by step (Trainer.run), values in and out
    callbacks              between executions: logs, checkpoints, preemption, evaluation, early stop
    steps_per_execution    the start's steps_per_execution: fixed, stored or measured
    evaluation             every eval example exactly once
    goodput                the phase clock, each start's record and how it ended
    utilisation            model FLOPs per step, TFLOP/s per chip and MFU against the chip's peak

Nothing here is run as a command, and nothing here names a task.
"""
