"""The Beam preprocessing on real files and the real in-process runner (FnApiRunner): bad inputs,
exact manifests, re-runs into the same folder, determinism, gs:// in and out on the emulator,
and a Dataflow dry run that builds the job offline."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from apache_beam.io.filesystems import FileSystems
from conftest import DATA_OVERRIDES, PROJECT, SAMPLE_BROKEN, run_preprocess

from {{ cookiecutter.package }}.core import input_pipeline, run_dir, topology
from {{ cookiecutter.package }} import preprocess, tasks
from {{ cookiecutter.package }}.core import preprocessing
from {{ cookiecutter.package }}.core.task import Listing, RawExample, RawRejection
from {{ cookiecutter.package }}.tasks.classification import ClassificationTask

MB = 2**20
# Small examples and a few shards keep each run to a second or two.
ARGS = (*DATA_OVERRIDES, "--num_shards", "3", "data.eval_fraction=0.2")


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
                found[metadata.path[len(root) + 1 :]] = handle.read()
    return found


@pytest.fixture(scope="module")
def reference(raw_dir, tmp_path_factory) -> tuple[Path, dict]:
    output = tmp_path_factory.mktemp("reference")
    return output, run_preprocess(raw_dir, output, *ARGS)


@pytest.fixture(scope="module")
def gcs_raw(gcs_server, raw_dir) -> str:
    """raw_dir copied to gs://test-bucket/raw through Beam's GCS client."""
    with gcs_server.environment() as bucket:
        for path in sorted(raw_dir.rglob("*")):
            if path.is_file():
                with FileSystems.create(bucket.path("raw", *path.relative_to(raw_dir).parts)) as handle:
                    handle.write(path.read_bytes())
        assert bucket.blocked_requests() == []
    return bucket.path("raw")


def test_choose_num_shards_follows_its_rules():
    """The sizing rules, checked on data from nothing to a terabyte and 1 to 64 reading hosts:
    never a shard over the target size, never one under the minimum unless there is only one,
    10 shards per reading host whenever those still hold the minimum, no more shards than either
    rule asks for, and more data or more hosts never means fewer shards."""
    choose, target, minimum, per_host = (
        topology.choose_num_shards,
        topology.TARGET_SHARD_BYTES,
        topology.MIN_SHARD_BYTES,
        topology.SHARDS_PER_HOST,
    )
    sizes = [0, 1000, 3 * MB, 50 * MB, 99 * MB, 200 * MB, 1024 * MB, 2000 * MB, 100 * 1024 * MB, 2**40]
    hosts = [1, 2, 4, 8, 16, 64]
    for total in sizes:
        for reading_hosts in hosts:
            shards = choose(total, 1, reading_hosts)
            assert shards >= 1
            assert total / shards <= target, (total, reading_hosts, shards)
            assert shards == 1 or total / shards >= minimum, (total, reading_hosts, shards)
            if total >= per_host * reading_hosts * minimum:
                assert shards >= per_host * reading_hosts, (total, reading_hosts, shards)
            assert shards <= max(1, per_host * reading_hosts, -(-total // target)), (total, reading_hosts, shards)
    for reading_hosts in hosts:
        counts = [choose(total, 1, reading_hosts) for total in sizes]
        assert counts == sorted(counts)
    for total in sizes:
        counts = [choose(total, 1, reading_hosts) for reading_hosts in hosts]
        assert counts == sorted(counts)
    # Bytes are examples times their size: the same rule.
    assert choose(1000, 3136, 4) == choose(1000 * 3136, 1, 4)


def test_manifest_is_exact_and_a_rerun_replaces_the_output(raw_dir, tmp_path):
    output = tmp_path / "out"
    first = run_preprocess(raw_dir, output, *DATA_OVERRIDES, "--num_shards", "5")
    assert [len(first["splits"][s]["files"]) for s in ("train", "eval")] == [5, 5]
    assert_exact(output, first)
    assert first["rejected"]["count"] == SAMPLE_BROKEN and first["ignored_files"] == 1

    for shards, compression, suffix in ((2, "gzip", ".tfrecord.gz"), (2, "none", ".tfrecord")):
        manifest = run_preprocess(
            raw_dir, output, *DATA_OVERRIDES, "--num_shards", str(shards), "--compression", compression
        )
        names = sorted(p.name for p in output.iterdir())
        expected = sorted(
            [f"{split}-{i:05d}-of-{shards:05d}{suffix}" for split in ("eval", "train") for i in range(shards)]
            + ["manifest.json", "rejected.jsonl", *manifest["artifacts"]]
        )
        assert names == expected  # no shard of an earlier run, no temporary folder
        assert manifest["compression"] == compression
        # the same examples whatever the shard count (a task that packs may fill its windows differently)
        assert [manifest["splits"][s]["num_sources"] for s in ("train", "eval")] == [
            first["splits"][s]["num_sources"] for s in ("train", "eval")
        ]
        assert_exact(output, manifest)


def test_a_failed_run_leaves_the_previous_output_intact(raw_dir, tmp_path, monkeypatch):
    output = tmp_path / "out"
    before = run_preprocess(raw_dir, output, *DATA_OVERRIDES, "--num_shards", "2")
    shards = shard_bytes(output)

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(preprocessing, "write_tfrecords", fail)
    with pytest.raises(Exception, match="disk full"):
        run_preprocess(raw_dir, output, *DATA_OVERRIDES, "--num_shards", "3")
    assert json.loads((output / "manifest.json").read_text()) == before
    assert shard_bytes(output) == shards

    monkeypatch.undo()  # the next successful run also clears the interrupted run's temporary folder
    (output / ".tmp-interrupted").mkdir(exist_ok=True)
    (output / ".tmp-interrupted" / "train-shard-00000.tfrecord").write_bytes(b"partial")
    run_preprocess(raw_dir, output, *DATA_OVERRIDES, "--num_shards", "2")
    assert not [p.name for p in output.iterdir() if p.name.startswith(".tmp-")]


def test_a_manifest_is_written_whole_or_not_at_all(raw_dir, tmp_path, monkeypatch):
    """The disk fills while a run adds its baselines to the manifest (its second write): the
    manifest it wrote first stays whole, and no part of the failed one is left behind."""
    output = tmp_path / "out"
    temporary = f"{preprocessing.MANIFEST}{preprocessing.TEMPORARY}"
    assert preprocessing.TEMPORARY == run_dir.TEMPORARY  # one pattern for every atomic write's leftover
    create, manifest_writes = FileSystems.create, []

    class DiskFull:
        def __init__(self, handle):
            self.handle = handle

        def write(self, data: bytes) -> None:
            self.handle.write(data[: len(data) // 2])
            raise OSError(28, "No space left on device")

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.handle.close()

    def fill_on_the_second_manifest(path, *args, **kwargs):
        handle = create(path, *args, **kwargs)
        if str(path).rsplit("/", 1)[-1].startswith(temporary):
            manifest_writes.append(path)
            if len(manifest_writes) == 2:
                return DiskFull(handle)
        return handle

    monkeypatch.setattr(FileSystems, "create", fill_on_the_second_manifest)
    with pytest.raises(OSError, match="No space left"):
        run_preprocess(raw_dir, output, *ARGS)
    monkeypatch.undo()
    assert len(manifest_writes) == 2
    written = json.loads((output / "manifest.json").read_text())
    assert "baselines" not in written and written["splits"]["train"]["num_examples"] > 0
    assert_exact(output, written)
    assert not [p.name for p in output.iterdir() if p.name.startswith(temporary)]

    # A killed writer's temporary manifest is removed by the next run, which adds the baselines.
    (output / f"{temporary}killed").write_bytes(b'{"task": ')
    again = run_preprocess(raw_dir, output, *ARGS)
    assert again["baselines"]["scores"] and {**again, "baselines": None} == {**written, "baselines": None}
    assert not [p.name for p in output.iterdir() if p.name.startswith(temporary)]


def test_runs_are_deterministic(raw_dir, reference, tmp_path):
    first_dir, first = reference
    second = run_preprocess(raw_dir, tmp_path, *ARGS)
    assert second == first
    assert shard_bytes(tmp_path) == shard_bytes(first_dir) and len(shard_bytes(tmp_path)) == 6
    assert (tmp_path / "rejected.jsonl").read_bytes() == (first_dir / "rejected.jsonl").read_bytes()
    # The split of each example is the stable hash of its source.
    rejected = {json.loads(line)["source"] for line in (first_dir / "rejected.jsonl").read_text().splitlines()}
    task = tasks.load(tasks.DEFAULT)
    sources = [
        example.source
        for relative in task.list_raw(str(raw_dir)).units
        for example in task.read_raw(relative, (raw_dir / relative).read_bytes())
        if isinstance(example, RawExample) and str(raw_dir / example.source) not in rejected
    ]
    expected_eval = sum(preprocessing.split_of(source, 0.2) == "eval" for source in sources)
    assert first["splits"]["eval"]["num_sources"] == expected_eval
    assert first["splits"]["train"]["num_sources"] == len(sources) - expected_eval


class RecordingFit:
    """The project's task, unchanged but for `fit_encoding`: it needs one, and writes what it was given
    to a file (Beam may run it in another thread or a copy of the task). A task without a fit of its
    own sees at most 5 payloads; one with a fit keeps its own `encoding_sample_size`."""

    def __init__(self, task, record: Path):
        self.task, self.record = task, record

    def __getattr__(self, name):  # only for what the instance lacks; not while unpickling
        if name in ("task", "record") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.task, name)

    needs_encoding_fit = True  # a stand-in, not a Task subclass: it cannot derive this from an override

    def encoding_sample_size(self, data_config) -> int:
        return self.task.encoding_sample_size(data_config) if self.task.needs_encoding_fit else 5

    def fit_encoding(self, train_payloads, data_config, workdir):
        import pickle

        self.record.write_bytes(pickle.dumps(list(train_payloads)))
        return self.task.fit_encoding(train_payloads, data_config, workdir) if self.task.needs_encoding_fit else {}


def test_the_encoding_fit_sees_only_a_bounded_sample_of_the_train_split(raw_dir, tmp_path, monkeypatch):
    """What preprocessing learns from the data (a tokenizer) comes from train examples only, and
    from as many of them as the config bounds the task's sample to (Testing.encoding_sample, e.g.
    data.tokenizer_sample=5), the same ones on every run."""
    import pickle

    task = tasks.load(tasks.DEFAULT)
    bound = task.testing().encoding_sample if task.needs_encoding_fit else ""
    assert bound or not task.needs_encoding_fit, f"{task.name}: a task with fit_encoding sets Testing.encoding_sample"
    by_split = {"train": [], "eval": []}
    for relative in task.list_raw(str(raw_dir)).units:
        for example in task.read_raw(relative, (raw_dir / relative).read_bytes()):
            if isinstance(example, RawExample):
                by_split[preprocessing.split_of(example.source, 0.2)].append(example.payload)
    seen = []
    for run in range(2):
        recording = RecordingFit(task, tmp_path / f"fit-{run}.pickle")
        monkeypatch.setattr(tasks, "load", lambda name, where="", recording=recording: recording)
        run_preprocess(raw_dir, tmp_path / f"out-{run}", *ARGS, *([bound] if bound else []))
        seen.append(pickle.loads(recording.record.read_bytes()))
    expected = int(bound.split("=")[1]) if bound else 5
    assert expected < len(by_split["train"])
    assert len(seen[0]) == expected and seen[0] == seen[1]
    assert all(payload in by_split["train"] for payload in seen[0])
    assert not [payload for payload in seen[0] if payload in by_split["eval"]]


def test_shards_are_not_runs_of_one_label(reference):
    """Records inside a shard follow a stable hash of their source, not the sorted path (which
    starts with the label): the share of records whose label repeats the previous one is near
    1/num_classes, as in a shuffled list."""
    import tensorflow as tf

    output, manifest = reference
    files, _ = input_pipeline.split_files(str(output), manifest, "train")
    for path in files:
        labels = [
            int(tf.io.parse_single_example(record, {"label": tf.io.FixedLenFeature([], tf.int64)})["label"])
            for record in tf.data.TFRecordDataset(path)
        ]
        repeats = sum(a == b for a, b in zip(labels, labels[1:])) / (len(labels) - 1)
        assert repeats < 2.0 / manifest["num_classes"], (path, repeats)


if not isinstance(tasks.load(tasks.DEFAULT), ClassificationTask):  # no labels, no runs of one: its own tests check
    del test_shards_are_not_runs_of_one_label


# ----------------------------------------------------------------------------- vocabularies


class TaggedLines:
    """A tagger's data path as a task writes it (the members preprocessing calls): each line of a
    RAW/*.tags file is a sentence, its domain, a tab and `word/TAG` pairs (`news<TAB>Ann/B-PER
    smiled/O`). Its vocabularies are the tags, one per token, and the domain; `encode` writes what it
    was handed into the record, so the shards show what preprocessing gave it."""

    name = "tagged_lines"
    reject_reasons = {"no_tags": "a line without word/TAG pairs"}
    needs_encoding_fit = False

    def list_raw(self, input_root: str) -> Listing:
        return Listing(sorted(path.name for path in Path(input_root).glob("*.tags")))

    def read_raw(self, relative: str, raw_bytes: bytes):
        for number, line in enumerate(raw_bytes.decode().splitlines(), 1):
            domain, _, text = line.partition("\t")
            pairs = [token.rpartition("/")[::2] for token in text.split()]
            if not pairs or not all(word and tag for word, tag in pairs):
                yield RawRejection(f"{relative}:{number}", "no_tags", line)
                continue
            words, tags = zip(*pairs)
            yield RawExample(f"{relative}:{number}", list(tags), {"words": list(words), "domain": domain})

    def vocabularies(self, example: RawExample) -> dict:
        return {"tags": example.target, "domain": [example.payload["domain"]]}

    def encode(self, example: RawExample, data_config, vocabularies: dict, artifacts: dict):
        record = {
            "source": example.source,
            "tag_ids": [vocabularies["tags"].index(tag) for tag in example.target],
            "domain_id": vocabularies["domain"].index(example.payload["domain"]),
            "vocabularies": vocabularies,
        }
        return json.dumps(record).encode(), {"tokens": len(example.target)}

    def pack(self, split: str, records, data_config):
        return list(records), {}

    def bytes_per_example(self, data_config) -> int:
        return 200

    def feature_spec(self, data_config) -> dict:
        return {"version": 1, "record": "json"}

    def manifest_fields(self, stats: dict, data_config, artifacts: dict, vocabularies: dict) -> dict:
        return {"tokens": stats["tokens"], "tag_names": vocabularies["tags"]}


def test_each_vocabulary_is_counted_over_the_whole_input_and_handed_to_encode(tmp_path):
    """A tagger's examples hold several names each (a tag per token) and a second field (a domain):
    the manifest counts every name of each field over train and eval (a tag seen only in eval, a
    domain only in train), names sorted; `encode` and `manifest_fields` get each field's sorted
    names, and a name's index there is what `encode` wrote. Counted here from the sentences written,
    on the real pipeline (FnApiRunner)."""
    import random
    from collections import Counter

    import apache_beam as beam
    import tensorflow as tf
    from apache_beam.options.pipeline_options import PipelineOptions

    from {{ cookiecutter.package }}.core import config as config_lib

    eval_fraction, rng = 0.3, random.Random(5)
    raw, output = tmp_path / "raw", tmp_path / "out"
    raw.mkdir()
    sentences = {}  # source -> (domain, [(word, tag), ...])
    for name in ("a.tags", "b.tags", "c.tags"):
        for number in range(1, 13):
            tags = [rng.choice(["O", "O", "O", "B-PER", "I-PER", "B-LOC"]) for _ in range(rng.randint(1, 6))]
            pairs = [(f"w{index}", tag) for index, tag in enumerate(tags)]
            sentences[f"{name}:{number}"] = (rng.choice(["news", "tweets"]), pairs)
    splits = {source: preprocessing.split_of(source, eval_fraction) for source in sentences}
    only_eval = next(source for source in sorted(sentences) if splits[source] == "eval")
    only_train = next(source for source in sorted(sentences) if splits[source] == "train")
    sentences[only_eval][1].append(("Oslo", "B-CITY"))
    sentences[only_train] = ("forum", sentences[only_train][1])
    for name in ("a.tags", "b.tags", "c.tags"):
        lines = [
            f"{domain}\t{' '.join(f'{word}/{tag}' for word, tag in pairs)}"
            for source, (domain, pairs) in sentences.items()
            if source.startswith(f"{name}:")
        ]
        (raw / name).write_text("\n".join([*lines, "news\tno-tag-here"]) + "\n")  # the last line is rejected

    pipeline = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
    data = config_lib.DataConfig(eval_fraction=eval_fraction)
    preprocessing.build_pipeline(pipeline, str(raw), str(output), TaggedLines(), data, num_shards=2)
    pipeline.run().wait_until_finish()
    manifest = json.loads((output / "manifest.json").read_text())

    tags = Counter(tag for _, pairs in sentences.values() for _, tag in pairs)
    domains = Counter(domain for domain, _ in sentences.values())
    assert tags["B-CITY"] == 1 and domains["forum"] == 1
    assert manifest["vocabularies"] == {"domain": dict(domains), "tags": dict(tags)}
    for field, counts in manifest["vocabularies"].items():  # written in sorted order
        assert list(counts) == sorted(counts), field
    names = {"domain": sorted(domains), "tags": sorted(tags)}
    assert manifest["tag_names"] == names["tags"] and manifest["tokens"] == sum(tags.values())
    assert manifest["rejected"]["count"] == 3

    records = [
        json.loads(record.numpy())
        for split in ("train", "eval")
        for record in tf.data.TFRecordDataset([str(output / file) for file in manifest["splits"][split]["files"]])
    ]
    assert sorted(record["source"] for record in records) == sorted(sentences)
    for record in records:
        domain, pairs = sentences[record["source"]]
        assert record["vocabularies"] == names
        assert [names["tags"][index] for index in record["tag_ids"]] == [tag for _, tag in pairs]
        assert names["domain"][record["domain_id"]] == domain


def test_a_category_name_that_is_not_a_string_is_refused():
    """A task whose `vocabularies` gives a number (a tag id, a class index), or one string where a list of
    names belongs (`{'domain': example.payload['domain']}`, which would count each character), fails
    preprocessing with a TypeError whose message is one line naming the task, the field, the example
    and the fix (under the traceback Beam logs for an error in its workers). A name of a subclass of
    str (numpy's) is counted as the plain string."""
    import numpy as np

    class Numbered(TaggedLines):
        def vocabularies(self, example):
            return {"tags": [0 for _ in example.target]}

    class Unlisted(TaggedLines):
        def vocabularies(self, example):
            return {"tags": example.target, "domain": example.payload["domain"]}

    class NumpyNames(TaggedLines):
        def vocabularies(self, example):
            return {"tags": list(np.array(example.target))}

    example = RawExample("a.tags:3", ["O"], {"words": ["x"], "domain": "news"})
    assert list(preprocessing.vocabulary_entries(TaggedLines(), example)) == [("tags", "O"), ("domain", "news")]
    [(field, name)] = preprocessing.vocabulary_entries(NumpyNames(), example)
    assert (field, name, type(name)) == ("tags", "O", str)
    with pytest.raises(TypeError) as raised:
        list(preprocessing.vocabulary_entries(Numbered(), example))
    message = str(raised.value)
    assert "\n" not in message and all(part in message for part in ("tagged_lines", "'tags'", "a.tags:3", "strings"))
    for domain in ("news", b"news"):
        unlisted = RawExample("a.tags:3", ["O"], {"words": ["x"], "domain": domain})
        with pytest.raises(TypeError) as raised:
            list(preprocessing.vocabulary_entries(Unlisted(), unlisted))
        assert str(raised.value) == (
            f"task tagged_lines: vocabularies() gave field 'domain' of a.tags:3 as one {type(domain).__name__}, "
            "not a list of names; give a list of names, e.g. [example.target]"
        )


def test_the_start_line_names_the_input_it_reads(raw_dir, tmp_path, capsys):
    """`make preprocess RAW=...` reads --input, which need not be the config's data.raw: the first
    line names the folder read, never the config's."""
    run_preprocess(raw_dir, tmp_path / "out", *ARGS, "data.raw=/elsewhere/raw")
    printed = capsys.readouterr().out
    assert re.match(rf"\d+ input files in {re.escape(str(raw_dir))} \(", printed), printed
    assert "/elsewhere/raw" not in printed


def test_gcs_in_and_out(gcs_bucket, gcs_raw, reference):
    output = gcs_bucket.path("tfrecords")
    manifest = run_preprocess(gcs_raw, output, *ARGS)
    assert manifest["source"] == gcs_raw
    assert manifest["rejected"]["count"] == SAMPLE_BROKEN
    assert_exact(output, manifest)  # read by TensorFlow's own gs:// filesystem
    assert shard_bytes(output) == shard_bytes(reference[0])
    assert not gcs_bucket.blocked_requests()


def test_local_to_gcs_in_a_subprocess(gcs_bucket, raw_dir, reference):
    """`python -m <package>.preprocess` as `make preprocess` runs it, without --runner; its shards
    are byte-identical to those of a run in another process."""
    output = gcs_bucket.path("from-local")
    env = {**os.environ, **gcs_bucket.env, "PYTHONPATH": str(PROJECT / "src"), "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        [sys.executable, "-m", "{{ cookiecutter.package }}.preprocess", "--input", str(raw_dir), "--output", output, *ARGS],
        env=env,
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "runner: FnApiRunner in this process: " in done.stdout  # chosen by the input's size
    read, written, rejected = map(int, re.search(r"read (\d+), written (\d+), rejected (\d+)", done.stdout).groups())
    examples = sum(split["num_examples"] for split in reference[1]["splits"].values())
    assert (written, rejected) == (examples, SAMPLE_BROKEN) and read > 0  # files read (a .jsonl holds many)
    with FileSystems.open(f"{output}/manifest.json") as handle:
        manifest = json.load(handle)
    assert_exact(output, manifest)
    assert shard_bytes(output) == shard_bytes(reference[0])
    assert not gcs_bucket.blocked_requests()


def dataflow_args(gcs_bucket, gcs_raw, output, *extra):
    return [
        "--input",
        gcs_raw,
        "--output",
        output,
        *DATA_OVERRIDES,
        "--runner=DataflowRunner",
        "--project=emulator-project",
        "--region=us-central1",
        f"--temp_location={gcs_bucket.path('dataflow', 'tmp')}",
        f"--staging_location={gcs_bucket.path('dataflow', 'staging')}",
        "--machine_type=n2-standard-4",
        "--max_num_workers=3",
        "--job_name=tpu-trainer-preprocess-test",
        "--dry_run=True",
        *extra,
    ]


def test_dataflow_dry_run_builds_the_job_offline(gcs_bucket, gcs_raw, capsys):
    output = gcs_bucket.path("dataflow-out")
    assert preprocess.main(dataflow_args(gcs_bucket, gcs_raw, output)) == 0
    printed = capsys.readouterr().out
    for expected in (
        "--project=emulator-project",
        "--region=us-central1",
        f"--temp_location={gcs_bucket.path('dataflow', 'tmp')}",
        "--max_num_workers=3",
        "job: tpu-trainer-preprocess-test",
        "Encode",
        "WriteShards",
        "worker image: ",
    ):
        assert expected in printed, printed
    assert not FileSystems.exists(f"{output}/manifest.json")  # nothing ran
    assert not gcs_bucket.blocked_requests()


def test_dataflow_dry_run_stages_the_project_from_pyproject(gcs_bucket, gcs_raw, tmp_path, capsys):
    """--setup_file=pyproject.toml (as `make preprocess RUNNER=dataflow` passes it): Beam builds the
    sdist with `python -m build --no-isolation`, which needs `build` and setuptools>=69 here."""
    pytest.importorskip("build")
    if (
        importlib.util.find_spec("setuptools") is None
        or int(importlib.metadata.version("setuptools").split(".")[0]) < 69
    ):
        pytest.skip("setuptools>=69 (pyproject.toml's build requirement) is not installed")
    # A copy: the build writes src/*.egg-info next to the sources.
    for name in ("pyproject.toml", "requirements.txt", "requirements-dev.txt"):
        shutil.copy(PROJECT / name, tmp_path / name)
    shutil.copytree(PROJECT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    args = dataflow_args(
        gcs_bucket, gcs_raw, gcs_bucket.path("dataflow-out"), f"--setup_file={tmp_path / 'pyproject.toml'}"
    )
    assert preprocess.main(args) == 0
    assert "workflow.tar.gz" in capsys.readouterr().out


def test_dataflow_refuses_local_paths(tmp_path):
    with pytest.raises(preprocess.UserError, match="gs://"):
        preprocess.main(
            [
                "--input",
                str(tmp_path),
                "--output",
                "gs://b/out",
                "--runner=DataflowRunner",
                "--project=p",
                "--region=r",
                "--dry_run=True",
            ]
        )


def test_make_preprocess_on_dataflow_uses_the_project_answers():
    """`make preprocess RUNNER=dataflow` builds its Beam options from project.mk (shown with make -n)."""
    result = subprocess.run(
        [
            "make",
            "-n",
            "preprocess",
            "RUNNER=dataflow",
            "DRY_RUN=1",
            "RAW=gs://b/raw",
            "DATA_DIR=gs://b/tfrecords",
            "DATAFLOW_MAX_WORKERS=7",
        ],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        check=True,
    )
    command = result.stdout
    zone = "{{ cookiecutter.zone }}"
    for option in (
        "--input gs://b/raw",
        "--output gs://b/tfrecords",
        "--runner=DataflowRunner",
        "--project={{ cookiecutter.gcp_project }}",
        f"--region={zone.rsplit('-', 1)[0]}",
        "--temp_location=gs://{{ cookiecutter.gcs_bucket }}/dataflow/tmp",
        "--staging_location=gs://{{ cookiecutter.gcs_bucket }}/dataflow/staging",
        f"--setup_file={PROJECT}/pyproject.toml",
        "--max_num_workers=7",
        "--dry_run=True",
    ):
        assert option in command, option


def test_the_input_size_is_the_bytes_of_the_listed_files(raw_dir, gcs_bucket, gcs_raw):
    """What `make preprocess` sizes its runner by: the listed raw files and their bytes, from one
    listing, the same for the folder and its copy on gs://; files the task ignores do not count."""
    task = tasks.load(tasks.DEFAULT)
    listing = task.list_raw(str(raw_dir))
    size = preprocessing.input_size(str(raw_dir), listing)
    assert size == preprocessing.InputSize(
        len(listing.units), sum((raw_dir / unit).stat().st_size for unit in listing.units)
    )
    assert size.files < sum(1 for path in raw_dir.rglob("*") if path.is_file()) or not listing.ignored
    assert preprocessing.input_size(gcs_raw, task.list_raw(gcs_raw)) == size
    assert not gcs_bucket.blocked_requests()


def test_listed_files_outside_the_folder_count_at_the_mean_size_of_those_inside(tmp_path):
    """A CSV index may name files anywhere: the size is one listing of the folder, so files outside it
    are not opened (on gs:// that would be a request each) and count at the mean of the others."""
    from {{ cookiecutter.package }}.core.task import Listing

    root, elsewhere = tmp_path / "raw", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    for folder, name, size in ((root, "a.bin", 100), (root, "b.bin", 301), (elsewhere, "c.bin", 5000)):
        (folder / name).write_bytes(b"x" * size)
    outside = [str(elsewhere / "c.bin"), str(elsewhere / "d.bin")]  # d.bin is not even there
    size = preprocessing.input_size(str(root), Listing(["a.bin", "b.bin", *outside]))
    assert size == preprocessing.InputSize(4, 802)  # the two outside at the mean, 200.5 bytes each
    assert preprocessing.input_size(str(root), Listing(["a.bin", "b.bin"])) == preprocessing.InputSize(2, 401)
    assert preprocessing.input_size(str(root), Listing(outside)) == preprocessing.InputSize(2, 0)  # nothing to scale


PROCESS_REPORT = """import atexit, os, sys


def report():
    with open(os.environ["PROCESS_REPORT"], "a") as handle:
        handle.write(f"{' '.join(sys.argv)} tensorflow={'tensorflow' in sys.modules}\\n")


if os.environ.get("PROCESS_REPORT"):
    atexit.register(report)
"""


def choose(raw_dir, threshold, beam_args=(), cpus=2):
    """The local runner `make preprocess` takes for `raw_dir` when the task's size is `threshold`."""
    task = tasks.load(tasks.DEFAULT)
    sized = type("Sized", (), {"name": task.name, "multi_process_from_bytes": threshold})()
    return preprocessing.choose_local_runner(sized, str(raw_dir), task.list_raw(str(raw_dir)), list(beam_args), cpus)


def test_the_local_runner_follows_the_input_size_and_the_options_given(raw_dir):
    """Worker processes, one per CPU (at most MAX_LOCAL_WORKERS), from the task's size of input on
    and with 2 CPUs or more; this process below it, on 1 CPU or for a task without a size; runner
    options the user gave, as given. Each choice in one line that says why."""
    task = tasks.load(tasks.DEFAULT)
    size = preprocessing.input_size(str(raw_dir), task.list_raw(str(raw_dir)))
    at = preprocessing.megabytes(size.bytes)
    assert choose(raw_dir, size.bytes) == (
        ["--runner=FnApiRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"],
        f"runner: FnApiRunner, 2 worker processes: the input, {size}, is at least the {at} from which "
        f"worker processes pay back their start for task {task.name}",
    )
    assert f"--direct_num_workers={preprocessing.MAX_LOCAL_WORKERS}" in choose(raw_dir, 1, cpus=64)[0]
    below = preprocessing.megabytes(size.bytes + 1)
    assert choose(raw_dir, size.bytes + 1) == (
        ["--runner=FnApiRunner"],
        f"runner: FnApiRunner in this process: the input, {size}, is below the {below} from which worker "
        f"processes pay back their start for task {task.name}",
    )
    assert choose(raw_dir, 1, cpus=1) == (
        ["--runner=FnApiRunner"],
        f"runner: FnApiRunner in this process: the input is {size}, on 1 CPU",
    )
    assert choose(raw_dir, None)[0] == ["--runner=FnApiRunner"]
    assert "names no input size from which worker processes pay back" in choose(raw_dir, None)[1]
    for given, shown in (
        (["--runner", "FnApiRunner", "--num_workers=3"], "--runner FnApiRunner"),
        (["--runner=DataflowRunner", "--project=p"], "--runner=DataflowRunner"),
    ):
        assert choose(raw_dir, 1, given) == (given, f"runner: as given ({shown})")
    # Without a --runner, still the FnApiRunner: Beam's default may download a runner (Prism).
    for given, shown in (
        (["--direct_num_workers=1"], "--direct_num_workers=1"),
        (
            ["--direct_running_mode=multi_threading", "--direct_num_workers", "4"],
            "--direct_running_mode=multi_threading --direct_num_workers 4",
        ),
    ):
        assert choose(raw_dir, 1, given) == (
            [*given, "--runner=FnApiRunner"],
            f"runner: FnApiRunner, options as given ({shown})",
        )


def test_preprocessing_picks_worker_processes_from_the_tasks_size_unless_told(
    raw_dir, reference, tmp_path, monkeypatch, capsys
):
    """`make preprocess`'s entry point without runner options on the small sample, with the task's
    size lowered to the sample's: a real run in 2 worker processes, which write the in-process run's
    bytes; a runner option given on the command line wins over the size."""
    task = tasks.load(tasks.DEFAULT)
    size = preprocessing.input_size(str(raw_dir), task.list_raw(str(raw_dir)))
    monkeypatch.setattr(type(task), "multi_process_from_bytes", size.bytes)
    monkeypatch.setattr(preprocessing, "usable_cpus", lambda: 2)
    # The worker processes import the project from PYTHONPATH, as `make` exports it, and each new
    # process says at exit what it ran and whether it imported TensorFlow (a sitecustomize module).
    site, report = tmp_path / "site", tmp_path / "processes.txt"
    site.mkdir()
    (site / "sitecustomize.py").write_text(PROCESS_REPORT)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(site), str(PROJECT / "src"), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.setenv("PROCESS_REPORT", str(report))
    assert preprocess.main(["--input", str(raw_dir), "--output", str(tmp_path / "workers"), *ARGS]) == 0
    assert f"runner: FnApiRunner, 2 worker processes: the input, {size}, is at least" in capsys.readouterr().out
    assert shard_bytes(tmp_path / "workers") == shard_bytes(reference[0])
    workers = [line for line in report.read_text().splitlines() if "sdk_worker_main" in line]
    assert len(workers) == 2, workers
    # The workers encode without TensorFlow (core/example_proto.py): none of them imported it.
    assert all(line.endswith("tensorflow=False") for line in workers), workers

    given = ["--direct_num_workers=1"]
    assert preprocess.main(["--input", str(raw_dir), "--output", str(tmp_path / "given"), *ARGS, *given]) == 0
    assert "runner: FnApiRunner, options as given (--direct_num_workers=1)" in capsys.readouterr().out
    assert shard_bytes(tmp_path / "given") == shard_bytes(reference[0])


def test_make_preprocess_leaves_the_local_runner_to_the_input_size():
    """`make preprocess` (RUNNER=local) passes no runner option: the size of the input picks one."""
    result = subprocess.run(["make", "-n", "preprocess"], cwd=PROJECT, capture_output=True, text=True, check=True)
    command = next(line for line in result.stdout.replace("\\\n", " ").splitlines() if ".preprocess " in line)
    assert "--input" in command and not re.search(r"--runner|--direct_", command), command


def test_the_summary_rate_shows_its_digits():
    """`wrote ... in 6.7s (0.3 files/s)` for 2 files, not `(0 files/s)`; whole numbers from 10 up."""
    assert preprocessing.per_second(2, 6.7) == "0.3"
    assert preprocessing.per_second(1202, 5.1) == "236"
    assert preprocessing.per_second(30, 4.0) == "7.5"
    assert preprocessing.per_second(5, 0.0) == "0"


def test_the_sizes_of_several_bundles_merge_into_those_of_the_whole_split():
    """Each bundle keeps its splits' totals and largest examples (by the task's size statistic);
    merged, they are what one pass over every example keeps: the totals summed, the LARGEST largest
    across bundles, largest first (ties by source)."""
    import random

    rng = random.Random(0)
    examples = [(rng.choice(("train", "eval")), f"doc-{index}", float(rng.randrange(1, 50))) for index in range(60)]
    whole, parts = preprocessing.Sizes(), [preprocessing.Sizes() for _ in range(4)]
    for index, (split, source, size) in enumerate(examples):
        whole.add(split, source, size)
        parts[index % 4].add(split, source, size)
    merged = preprocessing.Sizes.merged(parts).manifest()
    assert merged == whole.manifest()
    for split in ("train", "eval"):
        sizes = sorted((size for s, _, size in examples if s == split), reverse=True)
        assert merged[split]["total"] == sum(sizes)
        assert [entry["size"] for entry in merged[split]["largest"]] == sizes[: preprocessing.LARGEST]
        assert merged[split]["largest"][0]["share"] == pytest.approx(sizes[0] / sum(sizes), abs=1e-6)
