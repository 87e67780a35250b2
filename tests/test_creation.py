"""Every option bakes into exactly the expected files, fully rendered, with the answers recorded."""

from __future__ import annotations

import json
import os
import py_compile
import re
import subprocess

import pytest

from conftest import ROOT, TASKS, TPU_TYPES, VENV, bake

EXPECTED_FILES = {
    ".cruft.json", ".gitignore", ".pre-commit-config.yaml", ".github/workflows/ci.yml", "Makefile", "README.md", "project.mk", "tpu.mk", "pyproject.toml",
    "launch.mk", "Dockerfile", ".dockerignore",
    "requirements.txt", "requirements-dev.txt",
    "configs/base.yaml", "configs/local.yaml", "configs/local-real.yaml", "configs/tpu.yaml", "configs/pod.yaml",
    "scripts/lib.sh", "scripts/pod_train.sh", "scripts/run.sh", "scripts/setup.sh", "scripts/tmux_run.sh",
    "scripts/template_update.sh", "scripts/tpu_cleanup.sh",
    *(f"src/{{package}}/{name}.py" for name in (
        "__init__", "bench_input", "bench_memory", "bench_preprocess", "bench_spe", "bench_startup",
        "capture_profile", "config",
        "doctor/__init__", "doctor/__main__", "doctor/batch", "doctor/data", "doctor/engine", "doctor/memory", "doctor/model",
        "doctor/tpu_vm", "doctor/training", "evaluate", "launch/__init__", "launch/gke", "launch/vertex", "new_task", "parity", "predict", "preprocess", "real_data", "sample_data",
        "tasks/__init__", "train")),
    # The library the commands share.
    *(f"src/{{package}}/core/{name}.py" for name in (
        "__init__", "baselines", "callbacks", "config", "distribute", "errors", "evaluation", "example_proto", "gcp", "goodput", "input_cursor", "input_pipeline",
        "keras", "levers", "memory", "model", "native_logs", "optimizers", "precision", "preemption", "preprocessing", "profiler",
        "recompute", "run_dir", "schedule", "steps_per_execution", "support", "task", "tensorflow_sets", "topology", "trainer",
        "utilisation", "warm_start")),
    # What `make new-task` copies: a working skeleton task, its configs and its test file.
    *(f"src/{{package}}/tasks/_skeleton/{name}" for name in (
        "__init__.py", "task.py", "model.py", "test_task.py", "README.md", "configs/base.yaml", "configs/local.yaml",
        "configs/tpu.yaml", "configs/pod.yaml")),
    *(f"tests/{name}.py" for name in (
        "conftest", "gcs_emulator", "test_async_checkpoint", "test_baselines", "test_bench", "test_callbacks", "test_config", "test_contract", "test_credentials", "test_doctor", "test_example_proto",
        "test_flops_loops",
        "test_gcs_emulator",
        "test_input", "test_layout", "test_memory", "test_new_task", "test_out_of_memory", "test_parity", "test_parity_randomness", "test_precision", "test_preprocess", "test_real_data", "test_schedule", "test_startup", "test_tensorboard",
        "test_run_dir", "test_tpu", "test_tpu_ops", "test_train", "test_vertex", "test_gke", "test_warm_start", "mutate")),
    "tests/mutate.toml",  # make mutate's targets
}
# What each task adds: its package under tasks/ (every file the template has there) and its own tests.
TASKS_DIR = ROOT / "{{cookiecutter.project}}" / "src" / "{{cookiecutter.package}}" / "tasks"
# What several tasks share (the text tasks' tokenizer and readers, the classifiers' objective): in every
# bake, for a task added later.
SHARED = ("text", "classification.py")


def package_files(name):
    path = TASKS_DIR / name
    files = [path] if path.is_file() else [p for p in path.rglob("*.py") if "__pycache__" not in p.parts]
    return {f"src/{{package}}/tasks/{p.relative_to(TASKS_DIR)}" for p in files}


TASK_FILES = {
    task: {*package_files(task), f"tests/test_task_{task}.py", *(file for name in SHARED for file in package_files(name))}
    for task in TASKS
}


TEMPLATE_COMMIT = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                 check=True).stdout.strip()


def files_of(project):
    return {str(p.relative_to(project)) for p in project.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("tpu_type", TPU_TYPES)
def test_bake_every_option(tmp_path, tpu_type, task):
    project = bake(tmp_path, project="vision-lab", tpu_type=tpu_type, task=task, gcp_project="acme-ml-research",
                   zone="us-east5-a", gcs_bucket="acme-tpu-data")
    assert project.name == "vision-lab"
    assert files_of(project) == {f.format(package="vision_lab") for f in EXPECTED_FILES | TASK_FILES[task]}
    others = [other for other in TASKS if other != task]
    for path in project.rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert "{{" not in text and "{%" not in text and "cookiecutter." not in text, path
            for other in others:  # a bake holds its own task only, and never names another
                assert other not in text and other.replace("_", " ") not in text, (path, other)
    for path in (project / "src").rglob("*.py"):
        py_compile.compile(str(path), doraise=True)
    state = json.loads((project / ".cruft.json").read_text())  # what `make template-update` starts from
    assert (state["template"], state["commit"]) == (str(ROOT), TEMPLATE_COMMIT)
    answers = state["context"]["cookiecutter"]
    assert (answers["tpu_type"], answers["task"], answers["gcs_bucket"]) == (tpu_type, task, "acme-tpu-data")
    project_mk = (project / "project.mk").read_text()
    assert "GCP_PROJECT ?= acme-ml-research" in project_mk and f"TPU_TYPE ?= {tpu_type}" in project_mk
    assert f'DEFAULT_TPU_TYPE = "{tpu_type}"' in (project / "src/vision_lab/core/topology.py").read_text()
    for config in ("base", "local", "local-real", "tpu", "pod"):  # every shipped config loads with the baked code
        subprocess.run([str(VENV / "bin/python"), "-m", "vision_lab.config", "--config", f"configs/{config}.yaml"],
                       cwd=project, env={"PYTHONPATH": str(project / "src")}, check=True, capture_output=True)


@pytest.mark.parametrize("task, more", [("text_classification", "language_model"),
                                        ("language_model", "image_classification, text_classification"),
                                        ("image_classification", "language_model")])
def test_a_project_can_hold_more_shipped_tasks(tmp_path, task, more):
    """more_tasks keeps other shipped tasks beside the project's own: their packages and tests, and
    configs/<task>/ holding the configs a project of that task ships, with the task's own data and
    run folders; every one of them loads with the baked code."""
    names = [name.strip() for name in more.split(",")]
    project = bake(tmp_path / "both", project="vision-lab", task=task, more_tasks=more)
    configs = {f"configs/{name}/{config}.yaml" for name in names for config in ("base", "local", "local-real", "tpu", "pod")}
    want = EXPECTED_FILES | TASK_FILES[task] | configs | {file for name in names for file in TASK_FILES[name]}
    if {"language_model", "text_classification"} <= {task, *names}:  # both text tasks: pretrain, then fine-tune
        want |= {"tests/test_fine_tune_from_the_language_model.py"}
    assert files_of(project) == {f.format(package="vision_lab") for f in want}
    for name in names:
        alone = bake(tmp_path / name, project="vision-lab", task=name)
        for config in ("base", "local", "local-real", "tpu", "pod"):
            ours = (project / "configs" / name / f"{config}.yaml").read_text()
            assert ours.replace(f"/{name}/", "/").replace(f"{name}/", "") == (alone / "configs" / f"{config}.yaml").read_text()
            subprocess.run([str(VENV / "bin/python"), "-m", "vision_lab.config", "--config", f"configs/{name}/{config}.yaml"],
                           cwd=project, env={"PYTHONPATH": str(project / "src")}, check=True, capture_output=True)
        base = (project / "configs" / name / "base.yaml").read_text()
        assert f"task: {name} " in base and f"raw: data/{name}/raw " in base and f"output_dir: runs/{name}/local" in base


# The targets every generated project promises (the template README and the generated README list them).
CONTRACT_TARGETS = {
    "setup", "test", "data", "preprocess", "train", "eval", "predict", "tensorboard", "new-task", "doctor", "parity", "profile",
    "bench", "bench-spe", "bench-preprocess", "bench-startup", "tpu-create", "tpu-list", "tpu-ssh", "tpu-stop", "tpu-start",
    "tpu-delete", "tpu-copy", "pod-train", "train-bg", "logs", "help", "lint", "format", "test-full", "test-tpu",
}
# A rule line with a help text, in any of the project's make files: "name: [prerequisites] ## [group] text"
# (`make help` lists the text under its group's heading).
DOCUMENTED_RULE = re.compile(r"^([^\s:#=$]+)\s*:(?!=)[^#\n]*## +(?:\[[a-z]+\] )?(\S.*)$", re.MULTILINE)


def make_database_targets(project) -> set[str]:
    """The targets make itself knows (its printed database, nothing run), as opposed to `make help`'s
    listing, which is only text grepped from the make files."""
    # -q: exit status 1 means "not up to date", not a failure; nothing is run.
    database = subprocess.run(["make", "-pRrq", ":"], cwd=project, capture_output=True, text=True, check=False,
                              env={**os.environ, "LC_ALL": "C"}).stdout
    targets, skip = set(), False
    for line in database.splitlines():
        if line.startswith("# Not a target:"):
            skip = True
        elif not line:
            skip = False
        elif not skip and (rule := re.match(r"^([^\s:#=$%]+):(?!=)", line)):
            targets.add(rule.group(1))
    return targets


def test_make_help_lists_every_target(default_project):
    result = subprocess.run(["make", "help"], cwd=default_project, capture_output=True, text=True, check=True)
    text = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout)
    listed = dict(re.findall(r"^  (\S+) +(\S.*)$", text, re.MULTILINE))
    documented = {name: help_text for path in [default_project / "Makefile", *default_project.glob("*.mk")]
                  for name, help_text in DOCUMENTED_RULE.findall(path.read_text())}
    assert CONTRACT_TARGETS <= listed.keys(), f"not listed: {sorted(CONTRACT_TARGETS - listed.keys())}"
    # Both ways: every rule with a help text is listed, with that text, and nothing else is.
    assert listed == documented
    missing = sorted(listed.keys() - make_database_targets(default_project))
    assert not missing, f"`make help` lists targets make does not have: {missing}"


def test_the_gitignore_keeps_cloud_credentials_out(tmp_path):
    """Service-account keys, ADC files and .env files next to the project are never committed."""
    project = bake(tmp_path, gcp_project="acme-ml-research", zone="us-central2-b", gcs_bucket="acme-tpu-data")
    secrets = ["my-sa-key.json", "credentials.json", "credentials-prod.json", "application_default_credentials.json",
               ".env", ".env.local", "configs/svc-key.json"]
    for name in secrets:
        (project / name).write_text("{}")
    (project / "notes.json").write_text("{}")
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    status = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all"], cwd=project,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    ignored = {line[3:] for line in status if line.startswith("!! ")}
    untracked = {line[3:] for line in status if line.startswith("?? ")}
    assert set(secrets) <= ignored
    assert "notes.json" in untracked  # other JSON is not swept away with them


@pytest.mark.parametrize("task", TASKS)
def test_each_bake_passes_make_lint(tmp_path, task):
    """ruff (lint and format check, the bake's own pyproject settings) and shellcheck are clean."""
    project = bake(tmp_path, task=task, gcp_project="acme-ml-research", zone="us-central2-b",
                   gcs_bucket="acme-tpu-data")
    result = subprocess.run(["make", "lint", f"VENV={VENV}"], cwd=project, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
