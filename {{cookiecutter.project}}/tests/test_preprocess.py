"""The Beam preprocessing on real files and the real in-process runner (FnApiRunner): bad inputs,
exact manifests, re-runs into the same folder, determinism, gs:// in and out on the emulator,
and a Dataflow dry run that builds the job offline."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from apache_beam.io.filesystems import FileSystems
from conftest import PROJECT, run_preprocess
from PIL import Image

from {{ cookiecutter.package }} import preprocess

MB = 2**20
# Small images and a few shards keep each run to a second or two.
ARGS = ("--image_size", "8", "--num_shards", "3", "--eval_fraction", "0.2")


def count_records(output: str, split: str, manifest: dict) -> int:
    """Records in a split's shards, counted by TensorFlow (local or gs://)."""
    import tensorflow as tf

    files = [f"{str(output).rstrip('/')}/{name}" for name in manifest["splits"][split]["files"]]
    compression = "GZIP" if manifest["compression"] == "gzip" else ""
    return sum(1 for _ in tf.data.TFRecordDataset(files, compression_type=compression))


def assert_exact(output, manifest: dict) -> None:
    for split, info in manifest["splits"].items():
        assert count_records(output, split, manifest) == info["num_examples"] == sum(info["examples_per_file"])


def shard_bytes(output) -> dict:
    """{file name: bytes} of the shards in a folder (local or gs://)."""
    root = str(output).rstrip("/")
    found = {}
    for pattern in ("*.tfrecord", "*.tfrecord.gz"):
        for metadata in FileSystems.match([f"{root}/{pattern}"])[0].metadata_list:
            with FileSystems.open(metadata.path) as handle:
                found[metadata.path[len(root) + 1:]] = handle.read()
    return found


def image_bytes(fmt: str, seed: int, size: int = 64) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, fmt)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def reference(raw_dir, tmp_path_factory) -> tuple[Path, dict]:
    output = tmp_path_factory.mktemp("reference")
    return output, run_preprocess(raw_dir, output, *ARGS)


@pytest.fixture(scope="module")
def gcs_raw(gcs_bucket, raw_dir) -> str:
    """raw_dir copied to gs://test-bucket/raw through Beam's GCS client."""
    for path in sorted(raw_dir.rglob("*")):
        if path.is_file():
            with FileSystems.create(gcs_bucket.path("raw", *path.relative_to(raw_dir).parts)) as handle:
                handle.write(path.read_bytes())
    return gcs_bucket.path("raw")


def test_choose_num_shards():
    choose = preprocess.choose_num_shards
    assert choose(0, 3136, 1) == 1
    assert choose(1000, 3136, 4) == 1  # 3 MB: one shard, however many hosts
    assert choose(1, 200 * MB, 1) == 10  # 10 shards of 20 MB for the one host
    assert choose(1, 2000 * MB, 1) == 16  # never over ~128 MB a shard
    assert choose(1, 1024 * MB, 1) == 10  # 10 shards for the one host (~102 MB each) beat 8 by size
    assert choose(1, 1024 * MB, 4) == 40  # 10 per host, ~26 MB each
    assert choose(1, 200 * MB, 4) == 20  # 10 per host would be 5 MB shards: as many 10 MB shards as fit
    assert choose(1, 50 * MB, 8) == 5
    assert choose(1, 100 * 1024 * MB, 4) == 800  # big data: the 128 MB target decides
    for examples, size, hosts in ((5000, 12352, 1), (10**6, 12352, 4), (10**5, 3136, 16)):
        shards = choose(examples, size, hosts)
        assert examples * size / shards <= preprocess.TARGET_SHARD_BYTES
        assert shards == 1 or examples * size / shards >= preprocess.MIN_SHARD_BYTES or \
            shards == -(-examples * size // preprocess.TARGET_SHARD_BYTES)


def test_truncated_images_do_not_decode(monkeypatch):
    from PIL import ImageFile

    # Even when another library has told PIL to decode truncated files (grey fill), they fail here.
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    for fmt in ("JPEG", "PNG"):
        data = image_bytes(fmt, seed=0)
        assert preprocess.load_image(data, 8).shape == (8, 8, 3)
        with pytest.raises(OSError) as caught:
            preprocess.load_image(data[:len(data) // 2], 8)
        assert preprocess.reject_reason(caught.value) == "truncated"


def test_bad_inputs_are_rejected_and_counted(tmp_path, capsys):
    raw = tmp_path / "raw"
    for label in ("a", "b"):
        (raw / label).mkdir(parents=True)
        for index in range(3):
            (raw / label / f"ok_{index}.png").write_bytes(image_bytes("PNG", seed=index))
            (raw / label / f"ok_{index}.jpg").write_bytes(image_bytes("JPEG", seed=index))
    jpeg, png = image_bytes("JPEG", seed=7), image_bytes("PNG", seed=7)
    bad = {
        "a/empty.png": (b"", "empty"),
        "a/half.jpg": (jpeg[:len(jpeg) // 2], "truncated"),
        "b/half.png": (png[:len(png) // 2], "truncated"),
        "b/text.jpeg": (b"not an image\n" * 20, "not_an_image"),
        "b/upper.PNG": (b"\x00" * 100, "not_an_image"),
    }
    for relative, (data, _) in bad.items():
        (raw / relative).write_bytes(data)
    (raw / "README.md").write_text("ignored\n")
    (raw / "a" / "notes.txt").write_text("ignored\n")
    (raw / "a" / "nested").mkdir()
    (raw / "a" / "nested" / "deep.png").write_bytes(image_bytes("PNG", seed=1))  # not RAW/<label>/<file>

    output = tmp_path / "out"
    manifest = run_preprocess(raw, output, "--image_size", "8")
    printed = capsys.readouterr().out

    assert manifest["rejected"]["count"] == len(bad)
    assert manifest["rejected"]["by_reason"] == {"empty": 1, "not_an_image": 2, "truncated": 2}
    assert manifest["ignored_files"] == 3
    rejected = [json.loads(line) for line in (output / "rejected.jsonl").read_text().splitlines()]
    assert {(r["source"], r["reason"]) for r in rejected} == {
        (str(raw / relative), reason) for relative, (_, reason) in bad.items()}
    assert all(r["detail"] and " at 0x" not in r["detail"] for r in rejected)
    assert sum(info["num_examples"] for info in manifest["splits"].values()) == 12
    assert_exact(output, manifest)
    # The Beam metrics, printed at the end.
    assert "read 17, written 12, rejected 5" in printed
    assert "'truncated': 2" in printed and "'empty': 1" in printed


def test_manifest_is_exact_and_a_rerun_replaces_the_output(raw_dir, tmp_path):
    output = tmp_path / "out"
    first = run_preprocess(raw_dir, output, "--image_size", "8", "--num_shards", "5")
    assert [len(first["splits"][s]["files"]) for s in ("train", "eval")] == [5, 5]
    assert_exact(output, first)
    assert first["rejected"]["count"] == 2 and first["ignored_files"] == 1

    for shards, compression, suffix in ((2, "gzip", ".tfrecord.gz"), (2, "none", ".tfrecord")):
        manifest = run_preprocess(raw_dir, output, "--image_size", "8", "--num_shards", str(shards),
                                  "--compression", compression)
        names = sorted(p.name for p in output.iterdir())
        expected = sorted([f"{split}-{i:05d}-of-{shards:05d}{suffix}" for split in ("eval", "train")
                           for i in range(shards)] + ["manifest.json", "rejected.jsonl"])
        assert names == expected  # no shard of an earlier run, no temporary folder
        assert manifest["compression"] == compression
        assert [manifest["splits"][s]["num_examples"] for s in ("train", "eval")] == \
            [first["splits"][s]["num_examples"] for s in ("train", "eval")]
        assert_exact(output, manifest)


def test_a_failed_run_leaves_the_previous_output_intact(raw_dir, tmp_path, monkeypatch):
    output = tmp_path / "out"
    before = run_preprocess(raw_dir, output, "--image_size", "8", "--num_shards", "2")
    shards = shard_bytes(output)

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(preprocess, "write_tfrecords", fail)
    with pytest.raises(Exception, match="disk full"):
        run_preprocess(raw_dir, output, "--image_size", "8", "--num_shards", "3")
    assert json.loads((output / "manifest.json").read_text()) == before
    assert shard_bytes(output) == shards

    monkeypatch.undo()  # the next successful run also clears the interrupted run's temporary folder
    (output / ".tmp-interrupted").mkdir(exist_ok=True)
    (output / ".tmp-interrupted" / "train-shard-00000.tfrecord").write_bytes(b"partial")
    run_preprocess(raw_dir, output, "--image_size", "8", "--num_shards", "2")
    assert not [p.name for p in output.iterdir() if p.name.startswith(".tmp-")]


def test_runs_are_deterministic(raw_dir, reference, tmp_path):
    first_dir, first = reference
    second = run_preprocess(raw_dir, tmp_path, *ARGS)
    assert second == first
    assert shard_bytes(tmp_path) == shard_bytes(first_dir) and len(shard_bytes(tmp_path)) == 6
    assert (tmp_path / "rejected.jsonl").read_bytes() == (first_dir / "rejected.jsonl").read_bytes()
    # The split of each file is the stable hash of its relative path.
    valid = [p for p in preprocess.list_images(str(raw_dir))[0] if p not in
             ("circle/empty.png", "square/not_an_image.jpg")]
    expected_eval = sum(preprocess.split_of(p, 0.2) == "eval" for p in valid)
    assert first["splits"]["eval"]["num_examples"] == expected_eval
    assert first["splits"]["train"]["num_examples"] == len(valid) - expected_eval


def test_gcs_in_and_out(gcs_bucket, gcs_raw, reference):
    output = gcs_bucket.path("tfrecords")
    manifest = run_preprocess(gcs_raw, output, *ARGS)
    assert manifest["source"] == gcs_raw
    assert manifest["rejected"]["count"] == 2
    assert_exact(output, manifest)  # read by TensorFlow's own gs:// filesystem
    assert shard_bytes(output) == shard_bytes(reference[0])
    assert not gcs_bucket.blocked_requests()


def test_local_to_gcs_in_a_subprocess(gcs_bucket, raw_dir, reference):
    """`python -m <package>.preprocess` as `make preprocess` runs it, without --runner; its shards
    are byte-identical to those of a run in another process."""
    output = gcs_bucket.path("from-local")
    env = {**os.environ, **gcs_bucket.env, "PYTHONPATH": str(PROJECT / "src"), "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-m", "{{ cookiecutter.package }}.preprocess", "--input", str(raw_dir),
                           "--output", output, *ARGS], env=env, cwd=PROJECT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "read 242, written 240, rejected 2" in done.stdout
    with FileSystems.open(f"{output}/manifest.json") as handle:
        manifest = json.load(handle)
    assert_exact(output, manifest)
    assert shard_bytes(output) == shard_bytes(reference[0])
    assert not gcs_bucket.blocked_requests()


def dataflow_args(gcs_bucket, gcs_raw, output, *extra):
    return ["--input", gcs_raw, "--output", output, "--image_size", "8",
            "--runner=DataflowRunner", "--project=emulator-project", "--region=us-central1",
            f"--temp_location={gcs_bucket.path('dataflow', 'tmp')}",
            f"--staging_location={gcs_bucket.path('dataflow', 'staging')}",
            "--machine_type=n2-standard-4", "--max_num_workers=3", "--job_name=tpu-trainer-preprocess-test",
            "--dry_run=True", *extra]


def test_dataflow_dry_run_builds_the_job_offline(gcs_bucket, gcs_raw, capsys):
    output = gcs_bucket.path("dataflow-out")
    assert preprocess.main(dataflow_args(gcs_bucket, gcs_raw, output)) == 0
    printed = capsys.readouterr().out
    for expected in ("--project=emulator-project", "--region=us-central1",
                     f"--temp_location={gcs_bucket.path('dataflow', 'tmp')}", "--max_num_workers=3",
                     "job: tpu-trainer-preprocess-test", "DecodeResizeEncode", "worker image: "):
        assert expected in printed, printed
    assert not FileSystems.exists(f"{output}/manifest.json")  # nothing ran
    assert not gcs_bucket.blocked_requests()


def test_dataflow_dry_run_stages_the_project_from_pyproject(gcs_bucket, gcs_raw, tmp_path, capsys):
    """--setup_file=pyproject.toml (as `make preprocess RUNNER=dataflow` passes it): Beam builds the
    sdist with `python -m build --no-isolation`, which needs `build` and setuptools>=69 here."""
    pytest.importorskip("build")
    if importlib.util.find_spec("setuptools") is None or \
            int(importlib.metadata.version("setuptools").split(".")[0]) < 69:
        pytest.skip("setuptools>=69 (pyproject.toml's build requirement) is not installed")
    # A copy: the build writes src/*.egg-info next to the sources.
    for name in ("pyproject.toml", "requirements.txt", "requirements-dev.txt"):
        shutil.copy(PROJECT / name, tmp_path / name)
    shutil.copytree(PROJECT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    args = dataflow_args(gcs_bucket, gcs_raw, gcs_bucket.path("dataflow-out"),
                         f"--setup_file={tmp_path / 'pyproject.toml'}")
    assert preprocess.main(args) == 0
    assert "workflow.tar.gz" in capsys.readouterr().out


def test_dataflow_refuses_local_paths(tmp_path):
    with pytest.raises(preprocess.UserError, match="gs://"):
        preprocess.main(["--input", str(tmp_path), "--output", "gs://b/out", "--runner=DataflowRunner",
                         "--project=p", "--region=r", "--dry_run=True"])


def test_make_preprocess_on_dataflow_uses_the_project_answers():
    """`make preprocess RUNNER=dataflow` builds its Beam options from project.mk (shown with make -n)."""
    result = subprocess.run(["make", "-n", "preprocess", "RUNNER=dataflow", "DRY_RUN=1", "RAW=gs://b/raw",
                             "DATA_DIR=gs://b/tfrecords", "DATAFLOW_MAX_WORKERS=7"],
                            cwd=PROJECT, capture_output=True, text=True, check=True)
    command = result.stdout
    zone = "{{ cookiecutter.zone }}"
    for option in ("--input gs://b/raw", "--output gs://b/tfrecords", "--runner=DataflowRunner",
                   "--project={{ cookiecutter.gcp_project }}", f"--region={zone.rsplit('-', 1)[0]}",
                   "--temp_location=gs://{{ cookiecutter.gcs_bucket }}/dataflow/tmp",
                   "--staging_location=gs://{{ cookiecutter.gcs_bucket }}/dataflow/staging",
                   f"--setup_file={PROJECT}/pyproject.toml", "--max_num_workers=7", "--dry_run=True"):
        assert option in command, option
