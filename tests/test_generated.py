"""The generated project works: its own test suite passes, and sample data -> Beam -> TFRecords ->
training on 8 CPU replicas -> evaluation reaches the accuracy its README promises."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from conftest import VENV, bake, project_env, shared_venv_lock


def make(project, *targets, timeout=1800, check=True):
    result = subprocess.run(["make", *targets, f"VENV={VENV}"], cwd=project, env=project_env(),
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0 or not check, f"make {' '.join(targets)} failed:\n{result.stdout[-6000:]}\n{result.stderr[-6000:]}"
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def set_up_project(default_project):
    """`make setup` into the shared virtualenv: installs the baked project and its dev tools."""
    with shared_venv_lock():
        make(default_project, "setup")
    return default_project


# A bake's test files that check the core with models of their own, or with the task's model only as
# a stand-in for any model: parity, the out-of-memory paths, background checkpoints and the callbacks,
# the FLOPs of loops, another run's weights and frozen layers, the benchmark of checkpoint saves. The same code and the same tests in every bake:
# make test runs them in the language model's bake (test_language_project_tests_pass) and leaves them
# out of the image and text bakes' fast tiers; make test-release runs every bake's whole fast tier
# (test_every_tier_passes).
CORE_ONLY = ("test_parity.py", "test_parity_randomness.py", "test_out_of_memory.py", "test_async_checkpoint.py",
             "test_callbacks.py", "test_flops_loops.py", "test_warm_start.py",
             "test_bench.py::test_bench_times_checkpoint_saves_on_local_disk_and_a_gcs_folder")


def without_core_only() -> str:
    """PYTEST_ARGS for a bake's make test that leave CORE_ONLY out."""
    return "PYTEST_ARGS=" + " ".join(f"--deselect=tests/{name}" if "::" in name else f"--ignore=tests/{name}"
                                     for name in CORE_ONLY)


def test_generated_project_tests_pass(set_up_project):
    """The bake's fast tier (`make test`), as a team runs it on every change, less CORE_ONLY (which the
    language model's bake runs)."""
    output = make(set_up_project, "test", without_core_only())
    assert " passed" in output and " failed" not in output


def run_end_to_end(project, *train_args, examples=1200, rejected=2):
    make(project, "data")
    preprocess = make(project, "preprocess")
    assert f"rejected {rejected}" in preprocess  # the sample's broken inputs, listed in rejected.jsonl
    manifest = json.loads((project / "data/tfrecords/manifest.json").read_text())
    assert manifest["splits"]["train"]["num_examples"] + manifest["splits"]["eval"]["num_examples"] == examples
    train = make(project, "train", f"ARGS={' '.join(train_args)}")
    assert "MirroredStrategy on CPU, 2 replicas" in train  # the shipped runtime.cpu_devices
    evaluate = make(project, "eval", f"ARGS={' '.join(train_args)}")
    # `make eval` restores the final checkpoint and must agree with the evaluation that ended `make
    # train` (replicas' batch-norm statistics are averaged first, as a checkpoint stores them).
    (accuracy, loss), = re.findall(r"eval accuracy ([0-9.]+), loss ([0-9.]+)", evaluate)
    trained_accuracy, trained_loss = re.findall(r"eval accuracy ([0-9.]+), loss ([0-9.]+)", train)[-1]
    assert accuracy == trained_accuracy and float(loss) == pytest.approx(float(trained_loss), abs=2e-4)
    run = project / "runs/local"
    assert (run / "config.yaml").exists() and list((run / "logs/train").glob("events.out.tfevents.*"))
    assert list((run / "checkpoints").glob("ckpt-*.index"))
    return json.loads((run / "metrics.json").read_text())


# Run inside a bake: its eval split's examples, as preprocessing split them (the sample's rejected
# inputs left out): [source, target, the text or None].
EVAL_EXAMPLES = """
import json, sys
from {package} import tasks
from {package}.core import config, preprocessing
from {package}.core.task import RawExample

cfg = config.load("configs/local.yaml", registry=tasks)
eval_fraction, task, raw = cfg.data.eval_fraction, tasks.load(cfg.task), "data/raw"
rejected = {{json.loads(line)["source"] for line in open("data/tfrecords/rejected.jsonl")}}
examples = []
for unit in task.list_raw(raw).units:
    for item in task.read_raw(unit, open(f"{{raw}}/{{unit}}", "rb").read()):
        if not isinstance(item, RawExample) or {{item.source, f"{{raw}}/{{item.source}}"}} & rejected:
            continue
        if (item.split or preprocessing.split_of(item.source, eval_fraction)) == "eval":
            examples.append([item.source, item.target, item.payload if isinstance(item.payload, str) else None])
print(json.dumps(examples))
"""


def eval_examples(project, package: str = "tpu_trainer") -> list:
    env = {**project_env(), "PYTHONPATH": str(project / "src"), "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([str(VENV / "bin/python"), "-c", EVAL_EXAMPLES.format(package=package)], cwd=project,
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def assert_predict_agrees_with_evaluation(metrics: dict, examples: list, predicted: str) -> None:
    """`make predict` on every eval example: its labels score the accuracy the evaluation reported
    (within one example: predict runs other batch shapes, and bfloat16 sums differ in the last bit)."""
    rows = [line.split("\t") for line in predicted.splitlines() if line.count("\t") == 2]
    assert len(rows) == len(examples) == metrics["eval_examples"]
    correct = sum(label == target for (label, _, _), (_, target, _) in zip(rows, examples))
    assert abs(correct - metrics["accuracy"] * len(examples)) <= 1.0 + 1e-6, (correct, metrics["accuracy"])


@pytest.mark.slow
def test_end_to_end_on_cpu_reaches_the_promised_accuracy(set_up_project):
    """data -> preprocess -> train -> eval with configs/local.yaml as shipped."""
    metrics = run_end_to_end(set_up_project)
    assert metrics["global_step"] == 400
    assert metrics["accuracy"] >= 0.9
    examples = eval_examples(set_up_project)
    paths = [str(set_up_project / "data/raw" / source) for source, _, _ in examples]
    predicted = make(set_up_project, "predict", f"INPUT={' '.join(paths)}")
    assert [line.split("\t")[-1] for line in predicted.splitlines() if line.count("\t") == 2] == paths
    assert_predict_agrees_with_evaluation(metrics, examples, predicted)


def assert_resumes_bitwise_equal(project, *also: str):
    """Runs the bake's exact-resume check (its slow tier, tests/test_train.py): runtime.deterministic on
    8 replicas in float32 with the task's random draws on, one start SIGKILLed, the next SIGTERMed, the
    third finishing with the weights and optimizer state of an uninterrupted run, bit for bit; and the
    slow tests of test_train.py named `also`. The same check for a fine-tune (its `from-another-run` case)
    runs in each bake's make test-full (make test-release)."""
    names = ["test_a_run_killed_and_preempted_ends_bitwise_equal_to_an_uninterrupted_one", *also]
    tests = subprocess.run([str(VENV / "bin/python"), "-m", "pytest", "-v", "-p", "no:cacheprovider", "-m", "slow",
                            "tests/test_train.py", "-k", f"({' or '.join(names)}) and not from-another-run"],
                           cwd=project, env=project_env(), capture_output=True, text=True, timeout=1200)
    assert tests.returncode == 0, tests.stdout[-6000:] + tests.stderr[-3000:]
    for name in names:  # a parametrised test passes in each of its cases
        outcomes = [line for line in tests.stdout.splitlines()
                    if f"::{name}" in line and re.search(r" (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", line)]
        assert outcomes and all(" PASSED" in line for line in outcomes), (name, tests.stdout[-3000:])


@pytest.mark.slow
def test_a_killed_and_preempted_run_resumes_bitwise_equal(set_up_project):
    """The image bake's, with augmentation on: a resumed start crops and flips each batch as the
    uninterrupted run did. With it, a run stopped by a preemption notice resumes on another slice
    size (2 replicas instead of 8) to its exact end."""
    assert_resumes_bitwise_equal(set_up_project, "test_a_preemption_notice_stops_the_run_and_it_resumes_to_the_exact_end")


@pytest.fixture(scope="module")
def text_project(tmp_path_factory):
    """A text_classification bake (installed into the shared virtualenv by the image bake's setup)."""
    return bake(tmp_path_factory.mktemp("text"), task="text_classification", gcp_project="acme-ml-research",
                zone="us-central2-b", gcs_bucket="acme-tpu-data")


def test_text_project_tests_pass(set_up_project, text_project):
    """The text bake's fast tier, less CORE_ONLY (which the language model's bake runs)."""
    output = make(text_project, "test", without_core_only())
    assert " passed" in output and " failed" not in output


@pytest.mark.slow
def test_a_killed_and_preempted_text_run_resumes_bitwise_equal(set_up_project, text_project):
    """The text_classification bake's, with dropout on: a resumed start draws the dropout masks that the
    uninterrupted run drew (the generators' state is in the checkpoint)."""
    assert_resumes_bitwise_equal(text_project)


@pytest.mark.release
@pytest.mark.parametrize("task", ["image_classification", "text_classification", "language_model"])
def test_every_tier_passes(set_up_project, text_project, language_project, task):
    """Each bake's `make test-full` less the TPU tests: its whole fast tier (CORE_ONLY included, which
    make test runs in the language model's bake only) and its slow tier (resume after SIGTERM and
    after a metadata preemption notice, calibration, a gs:// run, NaN handling, accumulation through
    train.py, the sample's learnability). About 25 minutes per task on 2 cores, so `make
    test-release` runs it and `make test` does not."""
    project = {"image_classification": set_up_project, "text_classification": text_project,
               "language_model": language_project}[task]
    result = subprocess.run([str(VENV / "bin/python"), "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-m",
                             "not tpu", "tests"],
                            cwd=project, env=project_env(), capture_output=True, text=True, timeout=5400)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]


@pytest.mark.release
def test_make_mutate_kills_nine_in_ten_mutants_of_every_target(set_up_project, language_project):
    """`make mutate` in the language model's bake (the core's targets are the same in every bake):
    cosmic-ray mutates each target's functions and runs the tests that claim them; every target
    scores at least 90% of its non-equivalent mutants killed, and each mutant's tests ran. About an
    hour on 2 cores."""
    output = make(language_project, "mutate", timeout=3 * 3600)
    report = json.loads((language_project / "build/mutate/report.json").read_text())
    assert {target["module"] for target in report} >= {"core/memory.py", "core/input_cursor.py", "core/levers.py"}
    for target in report:
        assert target["mutants"] > 0 and target["score"] >= 0.9 and not target["not run"], (target, output[-3000:])


@pytest.mark.slow
def test_text_end_to_end_reaches_the_promised_accuracy(set_up_project, text_project):
    """The text task as a user runs it: data -> preprocess (tokenizer) -> train -> eval -> doctor -> predict."""
    make(text_project, "data")
    preprocess = make(text_project, "preprocess")
    manifest = json.loads((text_project / "data/tfrecords/manifest.json").read_text())
    manifest_examples = manifest["splits"]["train"]["num_examples"] + manifest["splits"]["eval"]["num_examples"]
    assert manifest_examples >= 3000 and manifest["rejected"]["count"] >= 4 and "rejected" in preprocess
    assert manifest["tokenizer"]["sha256"] and (text_project / "data/tfrecords/tokenizer.model").exists()
    assert 0 < manifest["length_stats"]["share_truncated"] < 0.5
    train = make(text_project, "train")
    assert "MirroredStrategy on CPU, 2 replicas" in train  # the shipped runtime.cpu_devices
    metrics = json.loads((text_project / "runs/local/metrics.json").read_text())
    # Measured 0.91 on this configuration; the sample is built to be hard (a bag-of-words classifier
    # tops out near 0.92) and the parallel input order varies between runs, hence a margin below 0.9.
    assert metrics["accuracy"] >= 0.88
    doctor = make(text_project, "doctor")
    assert "seq_len" in doctor
    examples = eval_examples(text_project)
    texts = text_project / "to_classify.txt"
    texts.write_text("".join(" ".join(text.split()) + "\n" for _, _, text in examples))
    assert_predict_agrees_with_evaluation(metrics, examples, make(text_project, "predict", f"INPUT={texts}"))


@pytest.fixture(scope="module")
def language_project(tmp_path_factory):
    """A language_model bake (installed into the shared virtualenv by the image bake's setup)."""
    return bake(tmp_path_factory.mktemp("language"), task="language_model", gcp_project="acme-ml-research",
                zone="us-central2-b", gcs_bucket="acme-tpu-data")


def test_language_project_tests_pass(set_up_project, language_project):
    """The language model bake's fast tier (`make test`)."""
    output = make(language_project, "test", timeout=3600)
    assert " passed" in output and " failed" not in output


# The fast tier's test files whose code reaches what moves between the two TensorFlow sets: Keras'
# training loop and tracing (startup, callbacks, background checkpoints: private checkpoint API),
# graph internals (the FLOPs and memory count reads the traced graph's functions), tf.data (the input
# and its exact resume), precision, the TPU ops and strategy resolution, Beam (2.75 in that set) and
# the language model's own code. make test runs these on the TPU VM's set; make test-release runs the
# whole fast tier there (test_the_tpu_vms_tensorflow_set_passes_the_whole_fast_tier).
TF_SET_FILES = ("test_startup.py", "test_callbacks.py", "test_async_checkpoint.py", "test_flops_loops.py",
                "test_memory.py", "test_input.py", "test_precision.py", "test_tpu_ops.py", "test_tpu.py",
                "test_preprocess.py", "test_example_proto.py", "test_task_language_model.py")


def set_up_tf_set(tmp_path):
    """A v5e language-model bake with `make setup TF=2.19` (tensorflow 2.19.1 and what moves with it,
    from the package index) in a virtualenv of its own: (the project, `run(*make arguments)`)."""
    project = bake(tmp_path, project="tf-set", task="language_model", tpu_type="v5litepod-8")
    venv = tmp_path / "venv-tf2.19"
    env = project_env()

    def run(*arguments, timeout=3600):
        result = subprocess.run(["make", *arguments, f"VENV={venv}"], cwd=project, env=env, capture_output=True,
                                text=True, timeout=timeout)
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"make {' '.join(arguments)} failed:\n{output[-6000:]}"
        return output

    assert "Installed TensorFlow set 2.19" in run("setup", "TF=2.19", timeout=1800)
    installed = subprocess.run([str(venv / "bin/python"), "-c", "import importlib.metadata as m; print(*(m.version(p) "
                                "for p in ('tensorflow', 'tf-keras', 'tensorboard', 'apache-beam', 'protobuf')))"],
                               capture_output=True, text=True, check=True).stdout.split()
    assert installed[:4] == ["2.19.1", "2.19.0", "2.19.0", "2.75.0"] and installed[4].startswith("5."), installed
    return project, run


@pytest.mark.slow
def test_the_tpu_vms_tensorflow_set_passes_its_tests_and_trains(tmp_path):
    """requirements.txt's other TensorFlow set, the one a TPU VM gets (TF=2.19), on the CPU: a v5e
    bake's fast-tier files of TF_SET_FILES pass, and a short `make train` and `make doctor` run."""
    project, run = set_up_tf_set(tmp_path)
    others = sorted(path.name for path in (project / "tests").glob("test_*.py") if path.name not in TF_SET_FILES)
    assert set(TF_SET_FILES) <= {path.name for path in (project / "tests").glob("test_*.py")}
    output = run("test", "PYTEST_ARGS=" + " ".join(f"--ignore=tests/{name}" for name in others))
    assert " passed" in output and " failed" not in output
    run("data", "SMALL=1")
    run("preprocess")
    train = run("train", "ARGS=train.total_steps=20 train.steps_per_execution=5 train.log_every=10 "
                "train.checkpoint_every=10 runtime.cpu_devices=2")
    assert "MirroredStrategy on CPU, 2 replicas" in train and re.search(r"^step +20/20 ", train, re.MULTILINE), train[-3000:]
    doctor = run("doctor", "ARGS=runtime.cpu_devices=2")
    assert re.search(r"^PASS +tpu\.support +TF 2\.19\.1 on v5litepod-8 ", doctor, re.MULTILINE), doctor[-3000:]


@pytest.mark.release
def test_the_tpu_vms_tensorflow_set_passes_the_whole_fast_tier(tmp_path):
    """The same set: the bake's whole fast tier (`make test`), TF_SET_FILES and the rest."""
    _, run = set_up_tf_set(tmp_path)
    output = run("test")
    assert " passed" in output and " failed" not in output


@pytest.mark.release
def test_language_end_to_end_beats_the_unigram_baseline(set_up_project, language_project):
    """The language model as a user runs it: data -> preprocess (tokenizer, packing) -> train -> eval ->
    doctor -> predict, with configs/local.yaml as shipped; eval perplexity at most half the unigram one."""
    make(language_project, "data")
    make(language_project, "preprocess")
    manifest = json.loads((language_project / "data/tfrecords/manifest.json").read_text())
    assert manifest["rejected"]["count"] == 4 and manifest["tokenizer"]["eos_id"] == 2
    assert manifest["packing"]["train"]["padding_share"] < 0.05
    train = make(language_project, "train")
    assert "MirroredStrategy on CPU, 2 replicas" in train  # the shipped runtime.cpu_devices
    metrics = json.loads((language_project / "runs/local/metrics.json").read_text())
    assert metrics["perplexity"] <= 0.5 * manifest["unigram_perplexity"], (metrics, manifest["unigram_perplexity"])
    evaluate = make(language_project, "eval")
    (perplexity,) = re.findall(r"eval perplexity ([0-9.]+)", evaluate)
    assert float(perplexity) == pytest.approx(metrics["perplexity"], rel=1e-3)
    doctor = make(language_project, "doctor")
    assert "data.packing" in doctor and "0 failed" in doctor
    prompts = language_project / "prompts.txt"
    prompts.write_text("Mia was a little fox who\nEvery morning he walked to the\n")
    predicted = [line.split("\t") for line in make(language_project, "predict", f"INPUT={prompts}").splitlines()]
    rows = [row for row in predicted if len(row) == 2 and row[1].startswith("prompts.txt:")]
    assert len(rows) == 2 and all(continuation.strip() for continuation, _ in rows)


# Each bake's real-data recipe (its README's "Real data and the baselines": `make real-data`, `make
# preprocess`, `make train CONFIG=configs/local-real.yaml`): the corpus its commands name, and how far
# a re-measured headline may fall behind the figure the README records before the release check fails.
# The margins: the news language model's eval perplexity was 61.72, 71.61 and 65.27 over seeds 0, 1
# and 2 (the README records seed 0's, which a run repeats to the printed digit on the machine the
# README names); 6% above the figure is a real loss, not that machine's noise. On other numerics
# (another CPU, bfloat16) a run may land anywhere in the seeds' spread, so a failure elsewhere is first
# re-measured on the README's machine class. An accuracy
# moves between runs by about one standard error of its eval split: 1.2 points on 1,276 reviews; on
# 168 digits a point is under two images, and 3 points is five.
REAL_DATA_RECIPES = {
    "language_model": ("news", "perplexity", 0.06),  # relative: at most 6% above the figure
    "text_classification": ("movie-reviews", "accuracy", 0.025),  # absolute: at most 2.5 points below
    "image_classification": ("digits", "accuracy", 0.03),
}


def readme_real_data_figure(project, corpus: str) -> tuple[float, bool]:
    """(the headline figure the bake's README records for `corpus`, whether it says the model beat its
    best baseline there): the table row of "Real data and the baselines"."""
    readme = (project / "README.md").read_text()
    found = re.search(rf"^\| `{re.escape(corpus)}`:.*?\*\*([0-9.]+)\*\* \((beaten|NOT beaten)\)", readme, re.MULTILINE)
    assert found, f"the README records no figure for the corpus {corpus}"
    return float(found.group(1)), found.group(2) == "beaten"


@pytest.mark.release
@pytest.mark.parametrize("task", ["language_model", "text_classification", "image_classification"])
def test_the_real_data_recipe_holds_its_readme_figure(set_up_project, text_project, language_project, task):
    """The README's real-data figures are re-measured, not remembered: its recipe on a public corpus,
    run as the README gives it, reaches the recorded headline within the stated margin and still
    beats its best baseline where the README says it does (a change that makes the model learn less
    fails here; about 5 minutes per task on 2 cores)."""
    project = {"image_classification": set_up_project, "text_classification": text_project,
               "language_model": language_project}[task]
    corpus, headline, margin = REAL_DATA_RECIPES[task]
    figure, beaten = readme_real_data_figure(project, corpus)
    shutil.rmtree(project / "runs/real", ignore_errors=True)  # a fresh run, not a resumed one
    make(project, "real-data", f"CORPUS={corpus}")
    make(project, "preprocess", f"RAW=data/real/{corpus}", f"DATA_DIR=data/real/{corpus}-tfrecords")
    make(project, "train", "CONFIG=configs/local-real.yaml", f"DATA_DIR=data/real/{corpus}-tfrecords")
    metrics = json.loads((project / "runs/real/metrics.json").read_text())
    measured = metrics[headline]
    if headline == "perplexity":  # lower is better
        assert measured <= figure * (1 + margin), (f"{corpus}: {headline} {measured:.2f}, the README records "
                                                   f"{figure} (at most {figure * (1 + margin):.2f})")
    else:
        assert measured >= figure - margin, (f"{corpus}: {headline} {measured:.4f}, the README records {figure} "
                                             f"(at least {figure - margin:.4f})")
    if beaten:
        assert metrics["beats_best_baseline"], (corpus, measured, metrics["baselines"])


# The objective that replaces the scaffold's toy one in the test below: MSE still trains, and the
# mean absolute error is the headline, lower is better.
REGRESSION_OBJECTIVE = '''
    headline_metric = "mae"
    higher_is_better = False
'''
REGRESSION_METRICS = '''
    def build_metrics(self, objective_config, manifest: Manifest) -> list:
        from ...core.keras import keras

        return [keras.metrics.MeanAbsoluteError(name="mae")]
'''


def committed_bake(tmp_path, project: str, **answers):
    """A fresh bake, committed, so that `git status` shows what adding a task changed."""
    baked = bake(tmp_path, project=project, gcp_project="acme-ml-research", zone="us-central2-b",
                 gcs_bucket="acme-tpu-data", **answers)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q"], cwd=baked, check=True)
    subprocess.run([*git, "add", "-A"], cwd=baked, check=True)
    subprocess.run([*git, "commit", "-qm", "bake"], cwd=baked, check=True)
    return baked


def new_task_tests_pass(project, package: str, name: str) -> set:
    """Nothing changed outside the task's package, configs and test file; its tests and the contract
    tests on it pass. Returns the names of the tests that passed."""
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=project,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    changed = {line[3:] for line in status}
    allowed = (f"src/{package}/tasks/{name}/", f"configs/{name}/", f"tests/test_task_{name}.py")
    assert changed and all(path.startswith(allowed) for path in changed), changed
    tests = subprocess.run([str(VENV / "bin/python"), "-m", "pytest", "-v", "-p", "no:cacheprovider",
                            f"tests/test_task_{name}.py", "tests/test_contract.py", "-k", name],
                           cwd=project, env=project_env(), capture_output=True, text=True, timeout=1800)
    assert tests.returncode == 0, tests.stdout[-6000:] + tests.stderr[-3000:]
    # `-k` alone would pass if the contract tests stopped finding the task: the caller names what must run.
    return set(re.findall(rf"tests/test_\w+.py::(\w+)(?:\[{name}\])? PASSED", tests.stdout))


@pytest.mark.slow
def test_a_new_task_needs_no_edit_outside_its_package(set_up_project, tmp_path):
    """The promise of the task seam, as a team would use it: `make new-task`, then a regression
    objective (MSE loss, MAE headline, lower is better) written into the new package only, then
    data -> preprocess -> train -> eval -> predict with its config, and the contract tests on it."""
    project = committed_bake(tmp_path, "reg-lab")
    name = "tabular_regression"
    created = make(project, "new-task", f"NAME={name}")
    assert f"task {name} added" in created
    task_py = project / "src/reg_lab/tasks" / name / "task.py"
    source = task_py.read_text()
    toy_objective = '    headline_metric = "loss"\n    higher_is_better = False\n'
    toy_metrics = "    def build_metrics(self, objective_config, manifest: Manifest) -> list:\n        return []\n"
    assert toy_objective in source and toy_metrics in source
    task_py.write_text(source.replace(toy_objective, REGRESSION_OBJECTIVE.lstrip("\n"))
                       .replace(toy_metrics, REGRESSION_METRICS.lstrip("\n")))

    config = f"CONFIG=configs/{name}/local.yaml"
    make(project, "data", config)
    assert "rejected 2" in make(project, "preprocess", config)
    train = make(project, "train", config)
    assert "MirroredStrategy on CPU, 2 replicas" in train and "8 numeric features" in train
    metrics = json.loads((project / f"runs/{name}/local/metrics.json").read_text())
    history = {entry["step"]: entry["mae"] for entry in metrics["history"]}
    assert metrics["best_mae"] == min(history.values()) and history[metrics["best_step"]] == metrics["best_mae"]
    # Against predicting the train split's mean for every eval row.
    rows = (project / f"data/{name}/raw/rows.csv").read_text().splitlines()[1:]
    targets = [float(row.split(",")[-1]) for row in rows if len(row.split(",")) == 9 and "oops" not in row]
    mean = sum(targets) / len(targets)
    baseline = sum(abs(target - mean) for target in targets) / len(targets)
    assert metrics["mae"] < 0.25 * baseline, (metrics["mae"], baseline)
    (mae,) = re.findall(r"eval mae ([0-9.]+)", make(project, "eval", config))
    assert float(mae) == pytest.approx(metrics["mae"], abs=1e-4)
    # A data key that parse_batch reads at run time (data.feature_noise): the next train takes a new
    # value from the config, on the same shards, without preprocessing again. Noise of one standard
    # deviation on every feature blurs what the model sees: its eval error grows.
    manifest = project / f"data/{name}/tfrecords/manifest.json"
    written = manifest.stat().st_mtime_ns
    make(project, "train", config, f"ARGS=data.feature_noise=1.0 runtime.output_dir=runs/{name}/noisy")
    noisy = json.loads((project / f"runs/{name}/noisy/metrics.json").read_text())
    assert manifest.stat().st_mtime_ns == written
    assert noisy["mae"] > 1.5 * metrics["mae"], (noisy["mae"], metrics["mae"])
    features = tmp_path / "features.csv"
    features.write_text("x0,x1,x2,x3,x4,x5,x6,x7\n" + ",".join(["0"] * 8) + "\n" + ",".join(["1"] * 8) + "\n")
    predicted = [line.split("\t") for line in make(project, "predict", config, f"INPUT={features}").splitlines()
                 if line.count("\t") == 1]
    # The sample's target is 10 + w.x + 1.5 sin(2 x0) x1 (+ noise): 10 at the origin, 10 + 1.5 sin 2 at ones.
    assert [name for _, name in predicted] == ["features.csv:2", "features.csv:3"]
    assert abs(float(predicted[0][0]) - 10.0) < 1.0 and abs(float(predicted[1][0]) - 11.36) < 1.0

    passed = new_task_tests_pass(project, "reg_lab", name)
    assert {
        "test_parsed_batches_have_static_shapes_and_encoding_is_deterministic",
        "test_broken_inputs_are_rejected_and_listed",
        "test_training_lowers_the_eval_loss_and_keeps_the_best_headline",
        "test_the_export_alone_predicts",
    } <= passed, f"the task's tests that passed: {sorted(passed)}"


@pytest.mark.slow
def test_a_contrastive_dual_encoder_needs_no_edit_outside_its_package(set_up_project, tmp_path):
    """An objective that is no mean of per-example losses, as a team would add it (tests/dual_encoder.py):
    `make new-task`, then two towers, an in-batch softmax over the global batch (gathered across the 8
    replicas) with objective.temperature a config key, and recall@1 over the whole eval split as the
    headline; trained with steps_per_execution 4; its own test checks that the 8-replica update is the
    one-device update; nothing outside its package, configs and test file changes."""
    from dual_encoder import TASK_CODE, TEST_CODE

    project = committed_bake(tmp_path, "pair-lab")
    name = "row_retrieval"
    assert f"task {name} added" in make(project, "new-task", f"NAME={name}")
    task_py = project / "src/pair_lab/tasks" / name / "task.py"
    source = task_py.read_text()
    assert source.endswith("\nTASK = NewTask()\n")
    task_py.write_text(source[: -len("TASK = NewTask()\n")] + TASK_CODE.replace("__task__", name).lstrip("\n"))
    test_py = project / f"tests/test_task_{name}.py"
    test_py.write_text(test_py.read_text() + TEST_CODE.replace("__task__", name).replace("{{package}}", "pair_lab"))
    local = project / f"configs/{name}/local.yaml"
    local.write_text(local.read_text() + "objective:\n  temperature: 0.1\n")

    config = f"CONFIG=configs/{name}/local.yaml"
    make(project, "data", config)
    make(project, "preprocess", config)
    train = make(project, "train", config, "ARGS=train.steps_per_execution=4 train.total_steps=200")
    assert "MirroredStrategy on CPU, 2 replicas" in train and "steps_per_execution 4;" in train
    run = project / f"runs/{name}/local"
    metrics = json.loads((run / "metrics.json").read_text())
    assert "temperature: 0.1" in (run / "config.yaml").read_text()
    # recall@1 among every eval row's record: chance is 1 in the eval split's size (0.003).
    assert metrics["recall_at_1"] > 0.5, metrics
    assert {"loss", "positive_similarity", "best_recall_at_1"} <= set(metrics)
    history = {entry["step"]: entry["recall_at_1"] for entry in metrics["history"]}
    assert metrics["best_recall_at_1"] == max(history.values())
    assert re.search(r"eval recall_at_1 [0-9.]+, loss [0-9.]+, positive_similarity", train)
    (recall,) = re.findall(r"eval recall_at_1 ([0-9.]+)", make(project, "eval", config))
    assert float(recall) == pytest.approx(metrics["recall_at_1"], abs=1e-4)
    bad = make(project, "train", config, "ARGS=objective.temperature=0", check=False)
    assert "objective.temperature must be positive, got 0" in bad

    passed = new_task_tests_pass(project, "pair_lab", name)
    assert {
        "test_the_gathered_in_batch_loss_has_the_one_device_gradient_on_8_replicas",
        "test_training_lowers_the_eval_loss_and_keeps_the_best_headline",
        "test_the_export_alone_predicts",
    } <= passed, f"the task's tests that passed: {sorted(passed)}"


@pytest.mark.slow
def test_a_task_copied_from_the_language_model_trains_beside_it_and_its_tests_pass(set_up_project, tmp_path):
    """`make new-task NAME=... FROM=language_model` in a language-model bake, as a team starts a variant
    (a masked-token objective on the same data, say): the copy writes its sample data, shards and run to
    its own folders, trains, and its copied tests and the contract tests on it pass; nothing outside its
    package, configs and test file changes."""
    project = committed_bake(tmp_path, "lm-lab", task="language_model")
    name = "masked_lm"
    assert f"task {name} added" in make(project, "new-task", f"NAME={name}", "FROM=language_model")
    config = f"CONFIG=configs/{name}/local.yaml"
    make(project, "data", config, "SMALL=1")
    make(project, "preprocess", config)
    train = make(project, "train", config, "ARGS=train.total_steps=20 train.log_every=10 train.eval_every=20")
    assert re.search(r"^step +20/20 ", train, re.MULTILINE), train[-3000:]
    metrics = json.loads((project / f"runs/{name}/local/metrics.json").read_text())
    assert metrics["global_step"] == 20 and metrics["perplexity"] > 0, metrics
    manifest = json.loads((project / f"data/{name}/tfrecords/manifest.json").read_text())
    assert manifest["task"] == name, manifest.get("task")
    # Its own folders: the shipped task's data and runs untouched (none were made).
    assert not (project / "data/raw").exists() and not (project / "data/tfrecords").exists()
    assert not (project / "runs/local").exists()
    passed = new_task_tests_pass(project, "lm_lab", name)
    assert {
        "test_parsed_batches_have_static_shapes_and_encoding_is_deterministic",
        "test_training_lowers_the_eval_loss_and_keeps_the_best_headline",
        "test_packing_loses_and_duplicates_no_token",
        "test_the_export_scores_as_the_trained_model",
    } <= passed, f"the task's tests that passed: {sorted(passed)}"


def test_a_text_classifier_fine_tunes_from_the_language_model_in_one_project(tmp_path):
    """more_tasks=language_model in a text-classification bake: the project then holds the
    pretrain-then-fine-tune test (the classifier preprocessed with the language model's tokenizer
    loads all of its run but the head; with its own tokenizer it is refused in one line), which passes."""
    project = bake(tmp_path, project="text-lab", task="text_classification", more_tasks="language_model")
    tests = subprocess.run([str(VENV / "bin/python"), "-m", "pytest", "-v", "-p", "no:cacheprovider",
                            "tests/test_fine_tune_from_the_language_model.py"],
                           cwd=project, env=project_env(), capture_output=True, text=True, timeout=1200)
    assert tests.returncode == 0, tests.stdout[-6000:] + tests.stderr[-3000:]
    assert len(re.findall(r"::test_\w+ PASSED", tests.stdout)) == 2, tests.stdout[-3000:]
