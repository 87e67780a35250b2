"""Every target that a baked project's `make help` lists, run the way a newcomer runs it.

First on a fresh bake, before any data or run exists: each target either works or stops with one
line that says what is missing ("error: ..."), never a Python traceback. Then in the natural order
on the small sample: data -> preprocess -> a short train -> eval -> predict -> TensorBoard (read
through its HTTP API) -> the benchmarks -> doctor -> an on-demand profile of a training job -> the
TPU and Pod targets with DRY_RUN=1 -> clean.

The list of targets comes from `make help`, and TARGETS below says how each one is run: a target
added to the Makefile without an entry here fails `test_every_listed_target_has_a_plan`.
"""

from __future__ import annotations

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

from conftest import VENV, bake, project_env, shared_venv_lock

pytestmark = pytest.mark.slow

TRACEBACK = "Traceback (most recent call last)"
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
#   "after":   on the small finished run, in the order of the test below: it must succeed;
#   "special": run another way, or elsewhere, as it says.
DRY = ("DRY_RUN=1",)
TARGETS: dict[str, dict] = {
    "setup": {"special": "run first by the `project` fixture"},
    "help": {"special": "its listing is what test_every_listed_target_has_a_plan checks"},
    "test": {"special": "run by tests/test_generated.py::test_generated_project_tests_pass"},
    "test-full": {"special": "the slow tier of `make test`; tests/test_generated.py runs the fast one"},
    "test-tpu": {"special": "needs a TPU VM"},
    "lint": {"after": ()},
    "format": {"special": "rewrites the sources; `make lint` checks the same rules"},
    "data": {"after": ("SMALL=1",)},  # SMALL=1 is dropped when `make help` does not offer it
    "preprocess": {"before": (), "after": ()},
    "train": {"before": (), "after": (f"ARGS={TRAIN_ARGS}",)},
    "eval": {"before": (), "after": (f"ARGS={SMALL_ARGS}",)},
    "predict": {"before": ("INPUT=x.png",), "special": "after: with two sample inputs"},
    "tensorboard": {"special": "served and read through its HTTP API, before and after"},
    "bench": {"before": (), "after": (f"ARGS={SMALL_ARGS} --seconds 0.5",)},
    "bench-spe": {"before": (), "after": (f"ARGS={SMALL_ARGS}",)},  # candidates up to train.log_every
    "bench-startup": {"before": (), "after": (f"ARGS={SMALL_ARGS}",)},  # three runs of one log interval or two
    "bench-preprocess": {"before": (), "after": ("BENCH_ARGS=--min_files=60 --repeats=1 --workers=2",)},
    "doctor": {"before": (), "after": (f"ARGS={SMALL_ARGS}",)},
    "profile": {"before": ("PROFILER_PORT=free", "DURATION=500"), "special": "after: from a training job"},
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
    "new-task": {"before": (), "special": "after: tests/test_generated.py::test_a_new_task_needs_no_edit_outside_its_package"},
    "template-update": {"special": "run by tests/test_update.py against a newer commit of a template clone"},
    "clean": {"special": "last: removes data and runs"},
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def make(project: Path, target: str, *variables: str, timeout: int = 600) -> subprocess.CompletedProcess:
    command = ["make", target, f"VENV={VENV}", *variables]
    result = subprocess.run(command, cwd=project, env=project_env(), capture_output=True, text=True, timeout=timeout)
    result.output = result.stdout + result.stderr
    result.shown = f"$ {' '.join(command)}  (exit {result.returncode})\n{result.output[-4000:]}"
    assert TRACEBACK not in result.output, result.shown
    return result


def fails_in_one_line(result: subprocess.CompletedProcess) -> None:
    assert result.returncode != 0, result.shown
    assert ONE_LINE_ERROR.search(result.output), f"no one-line error:\n{result.shown}"


def succeeds(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.shown
    return result.output


def listed_targets(project: Path) -> dict[str, str]:
    """target -> its line in `make help` (colours stripped)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", succeeds(make(project, "help")))
    return dict(re.findall(r"^  ([A-Za-z0-9_.-]+) +(.+)$", text, re.MULTILINE))


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A fresh bake with the default answers, set up (`make setup`) into the shared virtualenv."""
    baked = bake(tmp_path_factory.mktemp("every_target"), gcp_project="acme-ml", gcs_bucket="acme-data")
    with shared_venv_lock():
        succeeds(make(baked, "setup", timeout=1800))
    return baked


def test_every_listed_target_has_a_plan(project):
    listed = listed_targets(project)
    assert {"setup", "data", "preprocess", "train", "eval", "help"} <= listed.keys(), listed
    missing = sorted(listed.keys() - TARGETS.keys())
    assert not missing, f"`make help` lists targets that TARGETS in {Path(__file__).name} does not run: {missing}"


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

    def wait_for(self, description: str, matches, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._next_line(timeout=1)
            except queue.Empty:
                continue
            if line is None:
                pytest.fail(f"exited before {description}:\n{self.output[-4000:]}")
            if matches(line):
                return
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


def serve_tensorboard(project: Path, check, timeout: float = 240) -> None:
    """Starts `make tensorboard` and polls its HTTP API until check(port) holds (it loads the logs
    in the background after it starts answering)."""
    port = free_port()
    server = Background(project, "tensorboard", f"TENSORBOARD_PORT={port}")
    deadline, last = time.monotonic() + timeout, "no answer"
    try:
        while time.monotonic() < deadline:
            assert server.process.poll() is None, f"make tensorboard exited:\n{server.stop()[-4000:]}"
            try:
                check(port)
                return
            except (OSError, AssertionError, KeyError, ValueError) as error:  # not up yet, or still loading
                last = repr(error)
            time.sleep(2)
        pytest.fail(f"TensorBoard on port {port} did not pass its check within {timeout:.0f} s: {last}\n"
                    f"{server.stop()[-4000:]}")
    finally:
        assert TRACEBACK not in server.stop()


def test_without_prerequisites_every_target_fails_in_one_line(project):
    """No data, no run, no job listening: each target stops with one line naming what is missing."""
    assert not (project / "data").exists(), "this test runs on the fresh bake, before the one below"
    listed = listed_targets(project)
    for target, plan in TARGETS.items():
        if "before" not in plan or target not in listed:
            continue
        variables = [f"PROFILER_PORT={free_port()}" if v == "PROFILER_PORT=free" else v for v in plan["before"]]
        result = make(project, target, *variables)
        if target == "doctor":  # a checklist, not a single error: the missing data is one of its FAIL lines
            assert result.returncode != 0 and re.search(r"^ *FAIL\b.*(manifest|preprocess)", result.output,
                                                        re.MULTILINE | re.IGNORECASE), result.shown
        else:
            fails_in_one_line(result)
        if target == "profile":
            assert "runtime.profiler_port=" in result.output, result.shown

    # TensorBoard on a project without runs starts and answers (with nothing to show yet).
    serve_tensorboard(project, lambda port: get_json(port, "/data/plugins_listing"))
    succeeds(make(project, "clean"))  # nothing to remove yet


def predict_inputs(project: Path) -> list[str]:
    if json.loads((project / ".cruft.json").read_text())["context"]["cookiecutter"]["task"] == "text_classification":
        (project / "texts.txt").write_text("a first text to classify\nand a second one\n")
        return ["texts.txt"]
    images = sorted(p for p in (project / "data/raw").rglob("*") if p.suffix in (".png", ".jpg", ".jpeg"))
    return [str(path.relative_to(project)) for path in images[:2]]


def check_tensorboard_shows_the_run(port: int) -> None:
    plugins = get_json(port, "/data/plugins_listing")
    assert plugins["scalars"]["enabled"], plugins
    assert {"train", "eval"} <= set(get_json(port, "/data/runs"))
    tags = get_json(port, "/data/plugin/scalars/tags")
    assert {"learning_rate", "loss", "accuracy"} <= set(tags.get("train", {})), tags
    assert get_json(port, "/data/plugins_listing")["profile"]["enabled"], "no profile of steps 5-8"


def test_in_order_on_small_data_every_target_works(project):
    listed = listed_targets(project)

    def run(target, *variables, **kwargs):
        return succeeds(make(project, target, *variables, **kwargs))

    run("data", *[v for v in TARGETS["data"]["after"] if v.split("=")[0] in listed["data"]])
    output = run("preprocess")
    assert "rejected" in output and (project / "data/tfrecords/manifest.json").exists()
    run("train", *TARGETS["train"]["after"])
    metrics = json.loads((project / "runs/local/metrics.json").read_text())
    assert metrics["global_step"] == 20
    assert "accuracy" in run("eval", *TARGETS["eval"]["after"])
    if "predict" in listed:
        inputs = predict_inputs(project)
        output = run("predict", f"INPUT={' '.join(inputs)}")
        assert all(name in output for name in inputs), output

    serve_tensorboard(project, check_tensorboard_shows_the_run)

    for target in ("bench", "bench-spe", "bench-startup", "bench-preprocess"):
        result = make(project, target, *TARGETS[target]["after"])
        succeeds(result)
        last_line = result.stdout.strip().splitlines()[-1]  # the figures as JSON, after the logs
        assert isinstance(json.loads(last_line), dict), f"make {target}: the last line is not JSON:\n{result.shown}"
        # Beam's worker processes (--workers=2) each used to warn about a semi_persistent_directory.
        assert "semi_persistent" not in result.stdout + result.stderr, f"make {target}:\n{result.shown}"
    run("doctor", *TARGETS["doctor"]["after"])

    # An on-demand profile of a job started with runtime.profiler_port, as the README says.
    port = free_port()
    job = Background(project, "train", f"ARGS={PROFILED_JOB_ARGS} runtime.profiler_port={port}")
    try:
        job.wait_for("the profiler server line", lambda line: "profiler server on port" in line, timeout=300)
        # A job that is still building its model records nothing: wait for its first log line.
        job.wait_for("a first step line", lambda line: line.startswith("step "), timeout=300)
        output = run("profile", f"PROFILER_PORT={port}", "DURATION=1000", f"ARGS={PROFILED_JOB_ARGS}")
    finally:
        assert TRACEBACK not in job.stop()
    assert list((project / "runs/profiled/logs/plugins/profile").glob("*/*.xplane.pb")), output

    # The Cloud targets: DRY_RUN=1 prints the commands (on stdout, without the "+ " of a command
    # that runs), so nothing here needs gcloud or a TPU.
    for target, plan in TARGETS.items():
        if target in listed and (target.startswith(("tpu-", "pod-")) or target in ("train-bg", "logs", "lint")):
            output = run(target, *plan["after"])
            if "DRY_RUN=1" in plan["after"]:
                assert not re.search(r"^\+ ", output, re.MULTILINE), f"make {target} DRY_RUN=1 ran something:\n{output}"
                if target not in ("logs", "tpu-cleanup", "train-bg"):
                    assert "gcloud compute tpus" in output, output

    run("clean")
    assert not (project / "data").exists() and not (project / "runs").exists()
