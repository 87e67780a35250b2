"""The tf.data input: static shapes, per-host sharding that reads every record exactly once, and an
evaluation pass that counts each example once while keeping every batch the same shape."""

import collections
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf
from conftest import PROJECT

from {{ cookiecutter.package }}.core import config, distribute, input_pipeline, native_logs
from {{ cookiecutter.package }} import tasks
from {{ cookiecutter.package }}.core.errors import UserError

TASK = tasks.load(tasks.DEFAULT)


def load_manifest(data_dir):
    return json.loads((data_dir / "manifest.json").read_text())


def test_training_batches_have_static_shapes(data_dir):
    manifest = load_manifest(data_dir)
    files, counts = input_pipeline.split_files(str(data_dir), manifest, "train")
    dataset = input_pipeline.train_pipeline(files, counts, TASK, manifest, 12, seed=0)
    specs = tf.nest.flatten(dataset.element_spec)  # features and targets
    for spec in specs:  # what the TPU compiles for: one static shape
        assert spec.shape.is_fully_defined() and spec.shape[0] == 12
    first = next(iter(dataset))
    assert [t.shape for t in tf.nest.flatten(first)] == [s.shape for s in specs]


def read_pass(
    data_dir, manifest, num_pipelines, per_replica_batch, replicas_per_pipeline=1, cache=False, ordered=False
):
    """Simulates `num_pipelines` hosts reading the eval split; returns per-host real examples (a list
    in reading order when `ordered`) and batch counts."""
    files, counts = input_pipeline.split_files(str(data_dir), manifest, "eval")
    global_batch = per_replica_batch * replicas_per_pipeline * num_pipelines
    examples, batches = [], []
    for pipeline_id in range(num_pipelines):
        dataset = input_pipeline.eval_pipeline(
            files,
            counts,
            TASK,
            manifest,
            per_replica_batch,
            pipeline_id=pipeline_id,
            num_pipelines=num_pipelines,
            replicas_per_pipeline=replicas_per_pipeline,
            global_batch_size=global_batch,
            cache=cache,
        )
        batches.append(0)
        for features, targets, weights in dataset:
            tensors = [tensor.numpy() for tensor in tf.nest.flatten((features, targets))]
            assert all(tensor.shape[0] == per_replica_batch for tensor in tensors)  # static, also in the padded tail
            batches[-1] += 1
            for row, weight in enumerate(weights.numpy()):
                if weight:
                    examples.append(hashlib.sha1(b"".join(tensor[row].tobytes() for tensor in tensors)).hexdigest())
    return (examples if ordered else collections.Counter(examples)), batches


@pytest.mark.parametrize("num_pipelines", [1, 3, 6])  # 4 shards: 6 hosts use the record-level fallback
def test_a_cached_eval_split_reads_as_the_files_do(data_dir, num_pipelines):
    manifest = load_manifest(data_dir)
    read = read_pass(data_dir, manifest, num_pipelines, 4, ordered=True)
    assert read_pass(data_dir, manifest, num_pipelines, 4, cache=True, ordered=True) == read
    assert read_pass(data_dir, manifest, num_pipelines, 4, cache=True, ordered=True) == read  # from the held table


@pytest.mark.parametrize("num_pipelines", [2, 3, 4, 6])  # 4 shards: 6 hosts use the record-level fallback
def test_every_record_is_read_exactly_once_across_hosts(data_dir, num_pipelines, caplog):
    manifest = load_manifest(data_dir)
    reference, _ = read_pass(data_dir, manifest, 1, 4)
    assert sum(reference.values()) == manifest["splits"]["eval"]["num_examples"]
    combined, batches = read_pass(data_dir, manifest, num_pipelines, 4, replicas_per_pipeline=2)
    assert combined == reference  # same multiset: nothing lost, nothing read twice
    assert len(set(batches)) == 1  # every host runs the same number of steps
    if num_pipelines > 4:
        assert "every host reads all files" in caplog.text


def distributed_eval_examples(strategy, data_dir, manifest) -> collections.Counter:
    """The real examples of the eval split as training's evaluation reads them (all replicas)."""
    dataset, _ = input_pipeline.distributed_dataset(strategy, str(data_dir), TASK, manifest, "eval", 32, training=False)
    examples = []
    for batch in dataset:
        for features, targets, weights in zip(*(strategy.experimental_local_results(part) for part in batch)):
            tensors = [tensor.numpy() for tensor in tf.nest.flatten((features, targets))]
            for row, weight in enumerate(weights.numpy()):
                if weight:
                    examples.append(hashlib.sha1(b"".join(tensor[row].tobytes() for tensor in tensors)).hexdigest())
    return collections.Counter(examples)


def test_gzip_shards_read_like_plain_ones(raw_dir, data_dir, tmp_path):
    """`make preprocess PREPROCESS_ARGS=--compression=gzip`: training and evaluation read the same
    examples from the gzip shards as from plain ones (the input follows the manifest)."""
    from conftest import DATA_OVERRIDES, config_file, run_preprocess

    config_path = str(config_file(tasks.DEFAULT))
    manifest = run_preprocess(
        raw_dir, tmp_path, "--config", config_path, "--num_shards", "4", "--compression=gzip", *DATA_OVERRIDES
    )
    assert manifest["compression"] == "gzip" and all(
        name.endswith(".tfrecord.gz") for split in manifest["splits"].values() for name in split["files"]
    )
    strategy = distribute.resolve(config.load(None, ["runtime.strategy=cpu"], registry=tasks).runtime).strategy
    gzipped = distributed_eval_examples(strategy, tmp_path, manifest)
    assert gzipped == distributed_eval_examples(strategy, data_dir, load_manifest(data_dir))
    assert sum(gzipped.values()) == manifest["splits"]["eval"]["num_examples"]
    dataset, _ = input_pipeline.distributed_dataset(strategy, str(tmp_path), TASK, manifest, "train", 32, training=True)
    first = strategy.experimental_local_results(tf.nest.flatten(next(iter(dataset)))[0])
    assert len(first) == 8 and all(tensor.shape[0] == 4 for tensor in first)
    # `make bench` reads them too: its naive baseline's first pass over the train split gives the
    # plain shards' targets (augmentation makes the features random, the targets are not).
    from {{ cookiecutter.package }} import bench_input

    def one_pass_of_targets(data, manifest):
        files, _ = input_pipeline.split_files(str(data), manifest, "train")
        dataset = bench_input.naive_dataset(files, TASK, manifest, 1, manifest["compression"])
        count = manifest["splits"]["train"]["num_examples"]
        return collections.Counter(
            tuple(tensor.numpy().ravel().tolist())
            for _, targets in dataset.take(count)
            for tensor in tf.nest.flatten(targets)
        )

    assert one_pass_of_targets(tmp_path, manifest) == one_pass_of_targets(data_dir, load_manifest(data_dir))


def test_distributed_batches_are_per_replica(data_dir):
    manifest = load_manifest(data_dir)
    resolved = distribute.resolve(config.load(None, ["runtime.strategy=cpu"], registry=tasks).runtime)
    assert resolved.replicas == 8
    dataset, steps = input_pipeline.distributed_dataset(
        resolved.strategy, str(data_dir), TASK, manifest, "eval", 32, training=False
    )
    inputs, labels, weights = next(iter(dataset))
    per_replica = resolved.strategy.experimental_local_results(tf.nest.flatten(inputs)[0])
    assert len(per_replica) == 8 and all(t.shape[0] == 4 and t.shape.is_fully_defined() for t in per_replica)
    assert steps == -(-manifest["splits"]["eval"]["num_examples"] // 32)


def test_batch_that_does_not_divide_is_refused():
    resolved = distribute.resolve(config.load(None, ["runtime.strategy=cpu"], registry=tasks).runtime)
    with pytest.raises(
        UserError,
        match="train.global_batch_size=100 does not divide across 8 replicas; use a multiple of 8, e.g. 96 or 104",
    ):
        resolved.per_replica_batch_size(100)


def test_manifest_problems_are_one_clear_error(data_dir, tmp_path):
    with pytest.raises(UserError, match="no manifest.json in .*run `make preprocess`"):
        input_pipeline.read_manifest(str(tmp_path), TASK)
    mismatch = TASK.testing().mismatch
    with pytest.raises(UserError, match=re.escape(mismatch)):
        input_pipeline.read_manifest(str(data_dir), TASK, config.load(None, [mismatch], registry=tasks).data)
    manifest = load_manifest(data_dir)
    for index, (change, message) in enumerate(
        [
            ({"feature_spec": {"version": 0}}, "feature spec .* differs"),
            ({"splits": {"train": {"num_examples": 0}, "eval": manifest["splits"]["eval"]}}, "lists no train examples"),
        ]
    ):
        broken = tmp_path / f"broken{index}"
        broken.mkdir()
        (broken / "manifest.json").write_text(json.dumps({**manifest, **change}))
        with pytest.raises(UserError, match=message):
            input_pipeline.read_manifest(str(broken), TASK)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(UserError, match="is not valid JSON"):
        input_pipeline.read_manifest(str(tmp_path), TASK)


def test_a_cpu_machine_starts_without_the_cuda_probes_error_line():
    """TensorFlow's CUDA build logs `E ... failed call to cuInit` when it finds no GPU: the project's
    first look at the devices (distribute.physical_devices) leaves that line out on a machine
    without an NVIDIA driver, and nothing else: with verbose native logging the probe also reports
    the CUDA library it could not load and the missing kernel driver, and those lines still show."""
    if os.path.exists("/proc/driver/nvidia"):
        pytest.skip("a machine with an NVIDIA driver: the probe's errors are real there and are kept")
    env = {
        **os.environ,
        "PYTHONPATH": str(PROJECT / "src"),
        "TF_CPP_MIN_LOG_LEVEL": "0",
        "TF_CPP_MAX_VLOG_LEVEL": "1",
    }

    def probe(setup: str, call: str) -> list[str]:
        """The native lines written during `call` (timestamps left out: the text after `file:line] `)."""
        code = (
            f"import sys; {setup}; sys.stderr.write('probe\\n'); sys.stderr.flush(); devices = {call}; "
            "print('listed', [d.device_type for d in devices]); sys.stderr.write('done\\n')"
        )
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and "listed ['CPU']" in done.stdout, done.stderr[-3000:]
        during = done.stderr.split("probe\n", 1)[1]
        assert during.endswith("done\n"), during
        return [line.split("] ", 1)[-1] for line in during.splitlines()[:-1]]

    plain = probe("import tensorflow as tf", "tf.config.list_physical_devices()")
    if not any("cuInit" in line for line in plain):
        pytest.skip("this TensorFlow build does not probe CUDA here")
    others = [line for line in plain if "failed call to cuInit" not in line]
    assert others, plain  # verbose logging gives the filter lines to keep
    package = tasks.__name__.split(".")[0]
    assert probe(f"from {package}.core import distribute", "distribute.physical_devices()") == others


def test_without_lines_leaves_out_only_the_matching_native_lines(capfd):
    """What C++ code writes to file descriptor 2 inside the block comes back in order at its end,
    without the lines the pattern matches, also when the block raises."""
    pattern = re.compile(r"oneDNN supports DT_INT32")
    lines = [
        "E first: kept\n",
        "E oneDNN supports DT_INT32 only on platforms with AVX-512. Falling back\n",
        "W second: kept\n",
        "no newline at the end, kept",
    ]
    with pytest.raises(KeyError), native_logs.without_lines(pattern):
        for line in lines:
            os.write(2, line.encode())
        raise KeyError("the block's error still propagates")
    assert capfd.readouterr().err == "".join([lines[0], lines[2], lines[3]])
    os.write(2, b"E oneDNN supports DT_INT32 after the block: shown\n")
    assert capfd.readouterr().err == "E oneDNN supports DT_INT32 after the block: shown\n"


def test_onednn_notice_of_any_type_is_left_out_of_training_and_predict():
    """oneDNN's graph pass logs at ERROR level, once per process, the first type it leaves to Eigen
    ("oneDNN supports DT_BOOL only on platforms with AVX-512. ...": a Keras LSTM's transposed bool
    mask; DT_INT32 for int arithmetic): resolving the strategy (what train, eval and parity do first)
    spends that notice with the line left out, so no later graph logs it; predict's filter covers
    every type."""
    for line in (
        "2026-01-01 10:00:00.000000: E tensorflow/core/util/util.cc:131] oneDNN supports DT_BOOL only on "
        "platforms with AVX-512. Falling back to the default Eigen-based implementation if present.",
        "E0101 10:00:00.000000 1 util.cc:131] oneDNN supports DT_INT32 only on platforms with AVX-512.",
    ):
        assert native_logs.ONEDNN_TYPE_NOTICE.search(line), line
    assert not native_logs.ONEDNN_TYPE_NOTICE.search("E oneDNN failed to create a primitive: out of memory")
    env = {**os.environ, "PYTHONPATH": str(PROJECT / "src"), "TF_CPP_MIN_LOG_LEVEL": "0"}
    package = tasks.__name__.split(".")[0]

    def logged(setup: str) -> str:
        """stderr of a process that runs `setup`, then a graph that transposes a bool mask."""
        code = (
            f"import tensorflow as tf; from {package}.core import config, distribute; {setup}; "
            "tf.function(lambda x: tf.cast(tf.transpose(x > 0), tf.float32))(tf.constant([[1.0, -1.0]]))"
        )
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stderr

    if "oneDNN supports DT_BOOL" not in logged("pass"):
        pytest.skip("this TensorFlow build (or CPU) logs no oneDNN notice for a bool transpose")
    quiet = logged("distribute.resolve(config.RuntimeConfig(strategy='cpu', cpu_devices=2))")
    assert not native_logs.ONEDNN_TYPE_NOTICE.search(quiet), quiet[-3000:]


# ------------------------------------------------------------------- the resumable train order


@pytest.fixture(scope="module")
def numbered_shards(tmp_path_factory):
    """5 TFRecord files of 7, 3, 0, 11 and 5 records, each record its own number: what a pipeline
    reads shows which examples it fed, and in what order."""
    folder, files, counts, number = tmp_path_factory.mktemp("numbered"), [], [7, 3, 0, 11, 5], 0
    for index, count in enumerate(counts):
        path = str(folder / f"train-{index}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for _ in range(count):
                writer.write(str(number).encode())
                number += 1
        files.append(path)
    return files, counts


def fed(files, counts, *, start=0, take, pipeline_id=0, num_pipelines=1, window=4, seed=3, cache=False) -> list[int]:
    records = input_pipeline.train_records(
        files,
        counts,
        seed=seed,
        window=window,
        pipeline_id=pipeline_id,
        num_pipelines=num_pipelines,
        start=start,
        cache=cache,
    )
    return [int(record) for record in records.take(take).as_numpy_iterator()]


@pytest.mark.parametrize("cache", [False, True])
@pytest.mark.parametrize("num_pipelines", [1, 2, 8])  # 8 pipelines for 5 files: the record-level fallback
def test_the_train_order_rebuilt_at_any_position_continues_it(numbered_shards, num_pipelines, cache):
    """Each pipeline's stream rebuilt at a position (within a window, at a window or file boundary, at
    and across the end of an epoch) is the rest of the stream read from the start; read from memory
    (data.cache) it is the same stream."""
    files, counts = numbered_shards
    for pipeline in range(num_pipelines):
        stream = fed(files, counts, take=80, pipeline_id=pipeline, num_pipelines=num_pipelines)
        if cache:
            assert fed(files, counts, take=80, pipeline_id=pipeline, num_pipelines=num_pipelines, cache=True) == stream
        for position in (1, 3, 4, 6, 9, 13, 20, 25, 26, 27, 40, 53):
            rebuilt = fed(
                files, counts, start=position, take=12, pipeline_id=pipeline, num_pipelines=num_pipelines, cache=cache
            )
            assert rebuilt == stream[position : position + 12], (pipeline, position)


@pytest.mark.parametrize("num_pipelines", [1, 2, 8])
def test_every_record_is_fed_once_per_epoch_across_pipelines_in_a_new_order_each_epoch(numbered_shards, num_pipelines):
    files, counts = numbered_shards
    total = sum(counts)
    epochs = []
    for epoch in range(3):
        seen = []
        for pipeline in range(num_pipelines):
            if num_pipelines <= len(files):  # file-level: the pipeline's files, one epoch after another
                share = sum(counts[pipeline::num_pipelines])
                seen += fed(
                    files, counts, start=epoch * share, take=share, pipeline_id=pipeline, num_pipelines=num_pipelines
                )
            else:  # record-level: every num_pipelines-th record of one stream, epochs of `total` records
                first, end = (-(-(e * total - pipeline) // num_pipelines) for e in (epoch, epoch + 1))
                seen += fed(
                    files, counts, start=first, take=end - first, pipeline_id=pipeline, num_pipelines=num_pipelines
                )
        assert sorted(seen) == list(range(total)), (epoch, sorted(seen))
        epochs.append(seen)
    assert epochs[0] != epochs[1] != epochs[2]
    assert fed(files, counts, take=total, seed=4) != fed(files, counts, take=total, seed=3)  # the seed decides


def test_a_resume_reads_at_most_one_window_of_one_file(numbered_shards, tmp_path):
    """Whole files before the position are skipped by their counts, unread: a resume deep into the
    epoch opens neither a missing earlier file nor reads the whole split."""
    files, counts = numbered_shards
    stream = fed(files, counts, take=26, window=2)
    order = input_pipeline.file_order(len(files), 3, 0).numpy().tolist()
    first = next(index for index in order if counts[index])  # the first file the epoch reads
    moved = list(files)
    moved[first] = str(tmp_path / "gone.tfrecord")  # a resume past it must not open it
    assert (
        fed(moved, counts, start=counts[first] + 1, take=5, window=2) == stream[counts[first] + 1 : counts[first] + 6]
    )


def test_data_cache_auto_keeps_a_split_in_memory_only_when_its_known_size_fits_the_budget(
    data_dir, strategy, monkeypatch
):
    """data.cache=auto reads a split into memory (a record table) when the manifest gives its size
    and this host's share of it fits the budget (CACHE_LIMIT_BYTES here, well below a quarter of the
    host's available memory); a split of unknown size, or one byte over the budget, is read from its
    files. data.cache=none never keeps it."""
    manifest = load_manifest(data_dir)
    files, _ = input_pipeline.split_files(str(data_dir), manifest, "eval")
    table = (tuple(files), manifest.get("compression", "none"))
    size = manifest["splits"]["eval"]["bytes"]
    unknown = {key: value for key, value in manifest["splits"]["eval"].items() if key != "bytes"}

    def kept_in_memory(split: dict, budget: int, cache: str = "auto") -> bool:
        monkeypatch.setattr(input_pipeline, "CACHE_LIMIT_BYTES", budget)
        monkeypatch.delitem(input_pipeline._TABLES, table, raising=False)
        described = {**manifest, "splits": {**manifest["splits"], "eval": split}}
        input_pipeline.distributed_dataset(
            strategy, str(data_dir), TASK, described, "eval", 16, training=False, cache=cache
        )
        return table in input_pipeline._TABLES

    assert 0 < size < input_pipeline.cache_budget() // 2  # the budget below is the limit, not the host
    assert kept_in_memory(manifest["splits"]["eval"], budget=size)
    assert not kept_in_memory(manifest["splits"]["eval"], budget=size - 1)
    assert not kept_in_memory(unknown, budget=2**30)
    assert not kept_in_memory(manifest["splits"]["eval"], budget=2**30, cache="none")


def test_a_resume_under_gradient_accumulation_feeds_what_the_uninterrupted_run_feeds(data_dir, strategy):
    """With 3 micro-batches per update, the training input rebuilt 2 steps in (what a resume builds)
    feeds every replica, micro-batch by micro-batch, what the uninterrupted input feeds at its steps
    2 and 3: an update takes 3 global batches from the order, and the position counts them all."""
    manifest = load_manifest(data_dir)
    cfg = config.load(
        None,
        [
            f"data.dir={data_dir}",
            "data.shuffle_buffer=8",
            "train.global_batch_size=16",
            "train.gradient_accumulation_steps=3",
        ],
        registry=tasks,
    )
    resolved = distribute.resolve(cfg.runtime)

    def steps_from(start_step: int, steps: int) -> list[list]:
        batches = iter(input_pipeline.training_dataset(cfg, TASK, resolved, manifest, seed=5, start_step=start_step))
        return [
            [
                part.numpy()
                for tensor in tf.nest.flatten(next(batches))
                for part in strategy.experimental_local_results(tensor)
            ]
            for _ in range(steps)
        ]

    uninterrupted, resumed = steps_from(0, 4), steps_from(2, 2)
    assert all(part.shape[:2] == (3, 2) for part in uninterrupted[0])  # [micro-batches, per replica, ...]
    assert any((a != b).any() for a, b in zip(uninterrupted[1], uninterrupted[2]))  # the steps differ
    for step, (rebuilt, read_on) in enumerate(zip(resumed, uninterrupted[2:]), start=2):
        assert all((a == b).all() for a, b in zip(rebuilt, read_on)), f"step {step} differs after the resume"


def test_the_cursor_travels_in_the_checkpoint_and_a_changed_input_is_one_line(data_dir, tmp_path):
    from {{ cookiecutter.package }}.core import input_cursor, run_dir

    cfg = config.load(None, [f"data.dir={data_dir}"], registry=tasks)
    manifest = load_manifest(data_dir)
    layout = input_cursor.layout(cfg, manifest, input_pipelines=1, replicas=8)
    step = tf.Variable(120, dtype=tf.int64)
    saved = input_cursor.InputCursor(layout, step=step.numpy)
    saved.order = input_cursor.Order(seed=7, from_step=40)
    path = tf.train.Checkpoint(input=saved, step=step).write(str(tmp_path / "ckpt"))

    def restored(**changes):
        cursor = input_cursor.InputCursor({**layout, **changes}, step=lambda: 0)
        tf.train.Checkpoint(input=cursor).read(path).expect_partial()
        return cursor

    same = restored()
    assert same.restored["step"] == 120 and same.restored["train_files"] == manifest["splits"]["train"]["files"]
    assert same.resume(120, reseed=False) == input_cursor.Order(7, 40)  # the order goes on: position 80 steps in
    assert restored().resume(1, reseed=False) == input_cursor.Order(7, 40)  # from any step but the first
    fresh = input_cursor.InputCursor(layout, step=lambda: 0)
    assert fresh.resume(0, reseed=False) == input_cursor.Order(layout["seed"], 0)  # a new run: no note
    # A cursor saved before the order had a first epoch and pending pieces: epoch 0, nothing pending.
    assert input_cursor.Order.of({"order_seed": 7, "order_from_step": 40}) == input_cursor.Order(7, 40)
    with pytest.raises(UserError) as refused:
        restored(global_batch_size=256, replicas=16).resume(120, reseed=False)
    message = str(refused.value)
    assert "\n" not in message and "global_batch_size" in message and "replicas 8 -> 16" in message
    assert message.endswith("add runtime.resume_input=reseed to continue in a new order seeded by the step")
    reseeded = restored(shuffle_window=4).resume(120, reseed=True)
    assert (reseeded.seed, reseeded.from_step) == (cfg.runtime.seed + 120, 120) and "shuffle_window" in reseeded.note
    # A checkpoint written before cursors: the trainer's restore takes it (the model and optimizer),
    # and the run resumes in an order seeded by the step, and says so.
    from {{ cookiecutter.package }}.core.keras import keras

    def model_and_optimizer():
        inputs = keras.Input((2,))
        model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
        return model, optimizer

    model, optimizer = model_and_optimizer()
    tf.train.CheckpointManager(tf.train.Checkpoint(model=model, optimizer=optimizer), str(tmp_path / "old"), 2).save(5)
    model, optimizer = model_and_optimizer()
    cursor = input_cursor.InputCursor(layout, step=lambda: 0)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, input=cursor)
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path / "old"), 2)
    assert run_dir.restore_newest_readable(checkpoint, manager, cursor).endswith("ckpt-5")
    assert not input_cursor.saved_in(manager.latest_checkpoint) and input_cursor.saved_in(path)
    order = cursor.resume(120, reseed=False)
    assert cursor.restored is None and order.from_step == 120 and "holds no input position" in order.note


# ------------------------------------------------------------------ a resume on another layout


class Numbered:
    """A task whose records are their own numbers: what a replica is fed shows which records it read."""

    def parse_batch(self, batch, manifest, training=False, seed=None, data_config=None):
        return tf.strings.to_number(batch, tf.int64), tf.zeros_like(batch, tf.int64)


class Keyed:
    """A task whose batches are the keys their random draws would take (`Task.parse_batch`'s `seed`)."""

    def parse_batch(self, batch, manifest, training=False, seed=None, data_config=None):
        return seed, tf.zeros_like(batch, tf.int64)


def test_batch_keys_follow_the_place_in_the_run_and_a_later_order_never_reuses_one(tmp_path, strategy):
    """Same order, resumed: the same keys from the same batch on. An order that begins at a later step
    (a resume on another number of hosts counts its batches from 0 again, with the run's seed): none
    of its keys is one an earlier order drew, on any pipeline."""
    manifest = numbered_split(tmp_path, [40, 24])
    files = [str(tmp_path / name) for name in manifest["splits"]["train"]["files"]]

    def keys(pipeline_id: int, from_step: int, start: int = 0, take: int = 12) -> list[tuple[int, int]]:
        dataset = input_pipeline.train_pipeline(
            files,
            [40, 24],
            Keyed(),
            manifest,
            2,
            seed=11,
            shuffle_buffer=4,
            pipeline_id=pipeline_id,
            num_pipelines=2,
            start=start,
            from_step=from_step,
        )
        return [tuple(key.numpy()) for key, _ in dataset.take(take)]

    first = [keys(pipeline, 0) for pipeline in range(2)]
    assert keys(1, 0, start=6, take=9) == first[1][3:]  # resumed 3 batches in: the same keys on
    assert len({key for each in first for key in each}) == 24  # no two batches share one
    later = [keys(pipeline, 5) for pipeline in range(2)]
    assert not {key for each in later for key in each} & {key for each in first for key in each}
    # The trainer's input (training_dataset, 8 replicas on one pipeline) keys by the order's first step too.
    cfg = config.load(
        None, [f"data.dir={tmp_path}", "data.shuffle_buffer=4", "train.global_batch_size=16"], registry=tasks
    )
    resolved = distribute.resolve(cfg.runtime)

    def trained_keys(from_step: int) -> set:
        batches = iter(input_pipeline.training_dataset(cfg, Keyed(), resolved, manifest, seed=11, from_step=from_step))
        return {
            tuple(key)
            for part in strategy.experimental_local_results(next(batches)[0])
            for key in part.numpy().reshape(-1, 2)
        }

    assert trained_keys(0).isdisjoint(trained_keys(5))


def numbered_split(folder, counts) -> dict:
    """TFRecord files of `counts` records numbered 0, 1, ... in `folder`, and a manifest that lists them."""
    names, number = [], 0
    for index, count in enumerate(counts):
        names.append(f"train-{index}.tfrecord")
        with tf.io.TFRecordWriter(str(folder / names[-1])) as writer:
            for _ in range(count):
                writer.write(str(number).encode())
                number += 1
    return {"splits": {"train": {"files": names, "examples_per_file": list(counts)}}}


@pytest.mark.parametrize("first_steps", [2, 8])  # stopped in the first epoch, or in a later one
@pytest.mark.parametrize(
    "counts",
    [
        [6, 5, 7, 4, 6, 5, 7, 9],  # file-level sharding on 1, 2 and 4 pipelines; shares of 26 and 23
        [40, 13, 16],  # 2 pipelines' shares of 56 and 13 records; 4 pipelines: the record-level fallback
    ],
)
def test_epochs_resumed_on_1_then_4_input_pipelines_feed_every_record_once_each(
    tmp_path, strategy, counts, first_steps
):
    """Global batch 8, window 4: 2 simulated hosts train `first_steps` steps; a resume on 1 host (the
    real 8-replica input) trains 2 more; a resume on 4 hosts trains until the epoch ends. Each start
    rebuilds its order from the previous start's cursor, written to and read from a checkpoint.
    Across the three starts every record is fed exactly once in each epoch of the job up to the one
    the first start stopped in (the furthest host's: hosts with unequal shares drift apart, and the
    one behind reads to the end of that epoch too); after its pieces, each of the 4 hosts reads its
    own order of the next epoch; and a fourth start on the same 4 hosts mid-pieces
    feeds what the third would have fed, and so does a fifth past the longest host's pieces; a sixth
    on 2 hosts, past the third's pieces, completes the next epoch with every record once."""
    from {{ cookiecutter.package }}.core import input_cursor

    manifest = numbered_split(tmp_path, counts)
    files, total = [str(tmp_path / name) for name in manifest["splits"]["train"]["files"]], sum(counts)
    cfg = config.load(
        None,
        [f"data.dir={tmp_path}", "data.shuffle_buffer=4", "train.global_batch_size=8", "runtime.seed=11"],
        registry=tasks,
    )

    def start(hosts: int, step: int, saved: str | None) -> input_cursor.InputCursor:
        """A start on `hosts` input pipelines at `step`, its cursor restored from the checkpoint `saved`."""
        cursor = input_cursor.InputCursor(input_cursor.layout(cfg, manifest, hosts, 8), step=lambda: step)
        if saved:
            tf.train.Checkpoint(input=cursor).read(saved).expect_partial()
        cursor.resume(step, reseed=False)
        return cursor

    def saved_at(cursor, step: int) -> str:
        cursor.step = lambda: step
        return tf.train.Checkpoint(input=cursor).write(str(tmp_path / f"ckpt-{step}"))

    def hosts_read(cursor, step: int, steps: int) -> list[list[int]]:
        """What each simulated host feeds in `steps` steps from `step` (the records of its batches)."""
        order, hosts = cursor.order, cursor.layout["input_pipelines"]
        per_step = input_cursor.records_per_step(cursor.layout)
        return [
            [
                int(record)
                for record in input_pipeline.train_stream(
                    files,
                    counts,
                    seed=order.seed,
                    window=4,
                    pipeline_id=host,
                    num_pipelines=hosts,
                    consumed=(step - order.from_step) * per_step,
                    first_epoch=order.first_epoch,
                    pending=order.pending[host] if order.pending else (),
                    compression="none",
                    cache=False,
                )
                .take(steps * per_step)
                .as_numpy_iterator()
            ]
            for host in range(hosts)
        ]

    first = start(2, 0, None)
    shares = [input_pipeline.Share.of(files, counts, host, 2) for host in range(2)]
    epochs = [share.epoch_of(first_steps * 4) for share in shares]  # each host's epoch when it stopped
    job_epoch = max(epochs)  # the furthest host's: [40, 13, 16] after 8 steps, hosts in epochs 0 and 2
    records_fed = [record for host in hosts_read(first, 0, first_steps) for record in host]
    read_first = len(records_fed)

    second = start(1, first_steps, saved_at(first, first_steps))
    left = (job_epoch + 1) * total - read_first  # every record once in each epoch of the job, to its end
    drift = (
        f" (the hosts were in epochs {min(epochs)} to {job_epoch}: each reads to its end)"
        if min(epochs) < job_epoch
        else ""
    )
    assert second.order.note == (
        f"resumed on 1 host x 8 replicas from a 2 x 8 layout at step {first_steps}: {left} records left to the end "
        f"of epoch {job_epoch}{drift}, redistributed"
    )
    # The real input of 8 replicas on 1 pipeline (the trainer's): replica by replica, step by step.
    dataset, _ = input_pipeline.distributed_dataset(
        strategy,
        str(tmp_path),
        Numbered(),
        manifest,
        "train",
        8,
        training=True,
        seed=second.order.seed,
        shuffle_buffer=4,
        start_step=0,
        first_epoch=second.order.first_epoch,
        pending=second.order.pending,
    )
    batches = iter(dataset)
    for _ in range(2):
        numbers, _ = next(batches)
        records_fed += [int(n) for part in strategy.experimental_local_results(numbers) for n in part.numpy()]
    assert records_fed[read_first:] == hosts_read(second, first_steps, 2)[0]

    third = start(4, first_steps + 2, saved_at(second, first_steps + 2))
    left -= 16
    assert third.order.note.endswith(
        f"from a 1 x 8 layout at step {first_steps + 2}: {left} records left to the end of epoch {job_epoch}, "
        "redistributed"
    )
    pieces = [sum(piece.count for piece in host) for host in third.order.pending]
    assert sorted(pieces) == sorted(left * q // 4 - left * (q - 1) // 4 for q in range(1, 5))  # split evenly
    steps = -(-max(pieces) // 2) + 2  # past the longest host's pieces, into the next epoch
    read = hosts_read(third, first_steps + 2, steps)
    records_fed += [record for host, count in zip(read, pieces) for record in host[:count]]
    assert collections.Counter(records_fed) == dict.fromkeys(range(total), job_epoch + 1), collections.Counter(
        records_fed
    )

    for host, count in enumerate(pieces):  # then each host's own order from the start of the next epoch
        share = input_pipeline.Share.of(files, counts, host, 4)
        own = fed(
            files,
            counts,
            start=share.epoch_start(job_epoch + 1),
            take=len(read[host]) - count,
            pipeline_id=host,
            num_pipelines=4,
            window=4,
            seed=11,
        )
        assert read[host][count:] == own, host

    fourth = start(4, first_steps + 3, saved_at(third, first_steps + 3))  # the same layout, mid-pieces
    assert fourth.order == dataclasses.replace(third.order, note="")
    # A later start on the same layout, past the longest host's pieces: each host feeds on from where the
    # third start's order had come, in its own order of the next epoch (none re-reads its pieces' records).
    later = first_steps + 2 + steps - 1
    fifth = start(4, later, saved_at(third, later))
    assert fifth.order == dataclasses.replace(third.order, note="")
    assert hosts_read(fifth, later, 2) == [
        host[(steps - 1) * 2 :] for host in hosts_read(third, first_steps + 2, steps + 1)
    ]
    assert hosts_read(fourth, first_steps + 3, steps - 1) == [host[2:] for host in read]
    # An elastic resume after an elastic one, past its pieces: 4 -> 2 hosts where the third start
    # stopped. The next epoch's records the 4 hosts fed and the pieces the 2 hosts are handed are
    # that epoch's records once each.
    end = first_steps + 2 + steps
    sixth = start(2, end, saved_at(third, end))
    next_epoch = [record for host, count in zip(read, pieces) for record in host[count:]]
    handed = [sum(piece.count for piece in host) for host in sixth.order.pending]
    assert f"{sum(handed)} records left to the end of epoch {job_epoch + 1}" in sixth.order.note
    read = hosts_read(sixth, end, -(-max(handed) // 4))
    next_epoch += [record for host, count in zip(read, handed) for record in host[:count]]
    assert collections.Counter(next_epoch) == dict.fromkeys(range(total), 1)


def test_a_step_takes_each_pipelines_share_of_every_micro_batch():
    """What an elastic resume counts as read: per step, each input pipeline's share of the global
    batch times the accumulation steps (16 x 3 over 4 pipelines)."""
    from {{ cookiecutter.package }}.core import input_cursor

    layout = {"global_batch_size": 16, "gradient_accumulation_steps": 3, "input_pipelines": 4, "replicas": 8}
    assert input_cursor.records_per_step(layout) == 12


def test_orders_begun_at_other_steps_key_apart_and_a_share_is_a_value():
    """The first batch's key of orders begun at steps 0 to 5 (an elastic resume begins a new one):
    no two alike. A pipeline's share of the files is a value: nothing assigns to it."""
    keys = {tuple(input_pipeline.batch_key(7, 0, 0, from_step=step).numpy()) for step in range(6)}
    assert len(keys) == 6
    # The key itself, as the README gives it: a resume under a later version draws what this one drew.
    assert input_pipeline.batch_key(7, 3, 5, from_step=2).numpy().tolist() == [7 + 2 * 2**32, 3 * 2**40 + 5]
    share = input_pipeline.Share.of(["a", "b", "c"], [1, 2, 3], pipeline_id=1, num_pipelines=2)
    assert (share.files, share.counts, share.total) == (["b"], [2], 2)
    # As many files as pipelines: still a file each.
    assert input_pipeline.Share.of(["a", "b"], [1, 2], 1, 2) == input_pipeline.Share(["b"], [2], 1, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        share.stride = 2
    # Record-level sharding, pipeline 1 of 3 of one file of 10 records: records 1, 4, 7, then 0, 3, ...
    # of the next epoch (its 3rd record, index 9 of the stream, is the epoch's 10th record: epoch 1).
    records = input_pipeline.Share.of(["a"], [10], pipeline_id=1, num_pipelines=3)
    assert [records.epoch_of(kept) for kept in (0, 2, 3, 6, 7)] == [0, 0, 1, 1, 2]
    assert [records.epoch_start(epoch) for epoch in (0, 1, 2)] == [0, 3, 7]
