"""Beam and TensorFlow share gs:// files on the local GCS emulator (see gcs_emulator.py)."""

import os
import subprocess
import sys
import textwrap
import time

import apache_beam as beam
import tensorflow as tf
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

# conftest.py should list it too, so that it loads before tensorflow is imported
# (see TF_GCS_SETTINGS in gcs_emulator.py); listing it here lets this module run alone.
pytest_plugins = ["gcs_emulator"]

# FnApiRunner, not DirectRunner: DirectRunner first tries Prism, which downloads a binary.
BEAM_ARGS = ["--runner=FnApiRunner"]

BEAM_SCRIPT = textwrap.dedent(
    """
    import sys
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    output, *beam_args = sys.argv[1:]
    with beam.Pipeline(options=PipelineOptions(beam_args)) as pipeline:
        pipeline | beam.Create(["a", "b", "c"]) | beam.io.WriteToText(output, num_shards=2)
    """
)

TF_SCRIPT = textwrap.dedent(
    """
    import sys
    import tensorflow as tf

    for path in sorted(tf.io.gfile.glob(sys.argv[1])):
        print(tf.io.gfile.GFile(path).read(), end="")
    """
)


def _read_all(pattern):
    """The lines of every file matching ``pattern``, read with Beam."""
    lines = []
    for metadata in FileSystems.match([pattern])[0].metadata_list:
        with FileSystems.open(metadata.path) as f:
            lines += f.read().decode().splitlines()
    return sorted(lines)


def test_beam_writes_and_renames_then_tensorflow_reads(gcs_bucket):
    base = gcs_bucket.path("beam_to_tf")
    records = [f"record-{i}".encode() for i in range(10)]
    with beam.Pipeline(options=PipelineOptions(BEAM_ARGS)) as pipeline:
        _ = (
            pipeline
            | beam.Create(records)
            | beam.io.WriteToTFRecord(f"{base}/staged/data", file_name_suffix=".tfrecord", num_shards=2)
        )
    staged = sorted(m.path for m in FileSystems.match([f"{base}/staged/*"])[0].metadata_list)
    assert len(staged) == 2

    # Batched rename (copy + delete batches) and batched delete.
    final = [path.replace("/staged/", "/final/") for path in staged]
    FileSystems.rename(staged, final)
    scratch = [f"{base}/scratch/{i}.txt" for i in range(3)]
    for path in scratch:
        with FileSystems.create(path) as f:
            f.write(b"scratch")
    FileSystems.delete(scratch)

    assert tf.io.gfile.glob(f"{base}/staged/*") == []
    assert tf.io.gfile.glob(f"{base}/scratch/*") == []
    files = tf.io.gfile.glob(f"{base}/final/*.tfrecord")
    assert sorted(files) == final
    read_back = [record.numpy() for record in tf.data.TFRecordDataset(files)]
    assert sorted(read_back) == sorted(records)
    assert gcs_bucket.blocked_requests() == []


def test_tensorflow_writes_then_beam_reads(gcs_bucket):
    base = gcs_bucket.path("tf_to_beam")
    with tf.io.gfile.GFile(f"{base}/note.txt", "w") as f:
        f.write("written by tensorflow\n")

    variable = tf.Variable([1.0, 2.0])
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=variable), f"{base}/ckpt", max_to_keep=1)
    manager.save()
    variable.assign([3.0, 4.0])
    manager.save()  # and deletes ckpt-1: max_to_keep=1

    writer = tf.summary.create_file_writer(f"{base}/logs")
    with writer.as_default():
        tf.summary.scalar("loss", 0.5, step=1)
    writer.close()

    assert _read_all(f"{base}/note.txt") == ["written by tensorflow"]
    checkpoint_files = {m.path.rsplit("/", 1)[1] for m in FileSystems.match([f"{base}/ckpt/*"])[0].metadata_list}
    assert checkpoint_files == {
        "",  # the directory marker "ckpt/" that TF makes, as it does on real GCS
        "checkpoint",
        "ckpt-2.index",
        "ckpt-2.data-00000-of-00001",
    }
    assert len(FileSystems.match([f"{base}/logs/events.out.tfevents.*"])[0].metadata_list) == 1

    restored = tf.Variable([0.0, 0.0])
    tf.train.Checkpoint(v=restored).restore(manager.latest_checkpoint).assert_consumed()
    assert restored.numpy().tolist() == [3.0, 4.0]
    assert gcs_bucket.blocked_requests() == []


def test_subprocesses_need_only_the_fixture_env(gcs_bucket):
    output = gcs_bucket.path("subprocess", "out")
    env = {"PATH": os.environ["PATH"], **gcs_bucket.env}
    start = time.monotonic()
    beam_run = subprocess.run(
        [sys.executable, "-c", BEAM_SCRIPT, output, *BEAM_ARGS],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(f"Beam subprocess took {time.monotonic() - start:.1f} s")
    assert beam_run.returncode == 0, beam_run.stderr
    # Beam found the fake credentials at once: no ~20 s search ending anonymous.
    assert "Unable to find default credentials" not in beam_run.stderr
    assert _read_all(f"{output}*") == ["a", "b", "c"]

    tf_run = subprocess.run(
        [sys.executable, "-c", TF_SCRIPT, f"{output}*"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert tf_run.returncode == 0, tf_run.stderr
    assert sorted(tf_run.stdout.splitlines()) == ["a", "b", "c"]
    assert gcs_bucket.blocked_requests() == []


def test_the_emulators_environment_is_only_the_tests_own(gcs_server):
    """Outside a gs:// test the metadata server is the closed port conftest.py sets (a training run
    of a later test must not poll the proxy), and each test counts only its own refused requests."""
    import urllib.error
    import urllib.request

    def leave_the_machine(bucket):
        proxy = urllib.request.ProxyHandler({"http": bucket.env["HTTP_PROXY"]})
        try:
            urllib.request.build_opener(proxy).open("http://example.com/", timeout=10)
        except urllib.error.HTTPError as error:
            assert error.code == 403

    assert os.environ["GCE_METADATA_HOST"] == "127.0.0.1:9" and "HTTPS_PROXY" not in os.environ
    with gcs_server.environment() as first:
        assert os.environ["GCE_METADATA_HOST"] == first.env["GCE_METADATA_HOST"] != "127.0.0.1:9"
        leave_the_machine(first)
        assert len(first.blocked_requests()) == 1
    assert os.environ["GCE_METADATA_HOST"] == "127.0.0.1:9" and "HTTPS_PROXY" not in os.environ
    with gcs_server.environment() as second:
        assert second.blocked_requests() == []
    assert len(first.blocked_requests()) == 1
