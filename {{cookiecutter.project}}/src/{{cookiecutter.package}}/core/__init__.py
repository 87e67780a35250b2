"""The library every command shares, in the order of the data path:

    config                 typed config: YAML files + dotted.key=value overrides
    task                   the contract a task implements (tasks/ holds them)
    preprocessing          the Beam pipeline: raw files -> TFRecords + manifest
    topology, distribute   where it runs: TPU type, hosts, replicas; the strategy
    baselines              the trivial baselines of the data, fitted at preprocessing
    input_pipeline         TFRecords -> static batches on every replica
    input_cursor           the train input's position in every checkpoint (exact resume)
    precision, keras       bfloat16 or float32; the one Keras import
    model, schedule        the task's network, compiled with optimizer, loss and metrics; the learning rate
    optimizers, recompute  the optimizers (Adafactor's factored moments); recomputed blocks (model.remat)
    memory, levers         the step's memory plan and FLOPs from shapes; the memory levers
    utilisation            model FLOPs per step, TFLOP/s per chip and MFU against the chip's peak
    trainer                one start of a run, step by step (Trainer.run)
    callbacks              between executions: logs, checkpoints, preemption, evaluation, ...
    steps_per_execution    the start's steps_per_execution: fixed, stored or measured
    evaluation             every eval example exactly once
    run_dir                the run directory: paths, metrics.json (RunRecord), export
    goodput, profiler, preemption, gcp, errors, native_logs
                           the phase clock and its record; profiler server; metadata notices;
                           Cloud Storage credentials; one-line user errors; TensorFlow's C++ log filter

Nothing here is run as a command, and nothing here names a task.
"""
