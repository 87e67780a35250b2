"""A generated project follows the template's changes: cruft's update, and `make template-update`.

The template used here is a git clone of this repository with the working tree committed on top, so
that what is tested is the template as it is now, and its history (the commit before the task
seam, which moved most of the generated package) is there to update from.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cruft import create, update

from conftest import ROOT, VENV, bake, project_env

# The last template commit before the task seam: flat modules (features.py, doctor.py) that the
# seam moved into tasks/ and doctor/, so an update from it must delete files, not only add them.
BEFORE_THE_SEAM = "45692ef8502b9a3270ddb0a507984e45b007f271"
ANSWERS = {"project": "vision-lab", "description": 'Shapes, "quoted", with a comma and spaces',
           "tpu_type": "v5litepod-16", "gcp_project": "acme-ml-research", "zone": "us-east5-a",
           "gcs_bucket": "acme-tpu-data"}
GIT_ENV = {"GIT_AUTHOR_NAME": "Test", "GIT_AUTHOR_EMAIL": "test@example.com", "GIT_COMMITTER_NAME": "Test",
           "GIT_COMMITTER_EMAIL": "test@example.com"}


def git(cwd: Path, *args: str) -> str:
    result = subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **GIT_ENV}, capture_output=True, text=True)
    assert result.returncode == 0, f"git {' '.join(args)}: {result.stderr}"
    return result.stdout


def commit_all(cwd: Path, message: str) -> None:
    git(cwd, "add", "-A")
    git(cwd, "commit", "-q", "--allow-empty", "-m", message)


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A clone of this repository whose HEAD is the current working tree."""
    clone = tmp_path_factory.mktemp("template") / "tpu-template"
    git(ROOT, "clone", "-q", "--no-hardlinks", str(ROOT), str(clone))
    assert git(clone, "cat-file", "-t", BEFORE_THE_SEAM).strip() == "commit", "the template's history is needed"
    files = git(ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    for name in filter(None, files):
        source, target = ROOT / name, clone / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        elif target.exists():  # deleted in the working tree
            target.unlink()
    commit_all(clone, "the working tree")
    return clone


def snapshot(project: Path) -> dict[str, tuple[bytes, bool]]:
    """Every file outside .git: its bytes and whether it is executable."""
    return {str(path.relative_to(project)): (path.read_bytes(), os.access(path, os.X_OK))
            for path in sorted(project.rglob("*")) if path.is_file() and ".git" not in path.relative_to(project).parts}


def user_edit(project: Path) -> None:
    """A team's own changes: a variable in project.mk and a module of their own."""
    project_mk = project / "project.mk"
    project_mk.write_text(project_mk.read_text() + "\n# Our team's default slice.\nTPU_TYPE := v5litepod-16\n")
    (project / "src/vision_lab/our_layers.py").write_text('"""Layers of our own."""\n')


def test_update_from_before_the_task_seam_equals_a_fresh_bake_plus_the_edit(template, tmp_path):
    old = create(str(template), output_dir=tmp_path / "old", checkout=BEFORE_THE_SEAM, extra_context=ANSWERS,
                 no_input=True)
    assert (old / "src/vision_lab/features.py").exists() and (old / "src/vision_lab/doctor.py").exists()
    git(old, "init", "-q")
    commit_all(old, "generated")
    user_edit(old)
    commit_all(old, "our edits")

    assert update(old, skip_apply_ask=True)
    assert not git(old, "diff", "--name-only", "--diff-filter=U"), "conflicts"

    fresh = create(str(template), output_dir=tmp_path / "fresh", extra_context=ANSWERS, no_input=True)
    user_edit(fresh)
    updated, expected = snapshot(old), snapshot(fresh)
    assert not (old / "src/vision_lab/features.py").exists() and not (old / "src/vision_lab/doctor.py").exists()
    assert sorted(updated) == sorted(expected)  # nothing the new template does not generate is left
    assert [name for name in expected if updated[name] != expected[name]] == []
    assert "TPU_TYPE := v5litepod-16" in (old / "project.mk").read_text()
    state = json.loads((old / ".cruft.json").read_text())
    assert state["commit"] == git(template, "rev-parse", "HEAD").strip()
    assert state["context"]["cookiecutter"]["description"] == ANSWERS["description"]


def make_template_update(project: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "template-update", f"VENV={VENV}"], cwd=project,
                          env={**project_env(), **GIT_ENV}, capture_output=True, text=True, timeout=300)


def change_the_template(template: Path, message: str) -> None:
    """A newer template: a changed config line and a script it no longer generates."""
    config = template / "{{cookiecutter.project}}/configs/base.yaml"
    config.write_text(config.read_text().replace("total_steps: 400", "total_steps: 500", 1))
    (template / "{{cookiecutter.project}}/scripts/tmux_run.sh").unlink()
    commit_all(template, message)


def test_make_template_update_on_a_branch_and_its_conflicts(template, tmp_path):
    """A bake with plain cookiecutter records its template; `make template-update` takes in a newer
    commit on a branch, and stops with one line on a conflicting edit."""
    newer = tmp_path / "newer-template"
    git(tmp_path, "clone", "-q", str(template), str(newer))
    project = bake(tmp_path / "projects", template=newer, **ANSWERS)
    state = json.loads((project / ".cruft.json").read_text())
    assert (state["template"], state["commit"]) == (str(newer), git(newer, "rev-parse", "HEAD").strip())
    assert "total_steps: 400" in (project / "configs/base.yaml").read_text()

    result = make_template_update(project)
    assert result.returncode != 0 and "git init" in result.stderr  # not a repository yet
    git(project, "init", "-q", "-b", "main")
    commit_all(project, "generated")
    assert make_template_update(project).stdout.strip().endswith(f"Already up to date with {newer} at "
                                                                 f"{state['commit'][:12]}.")
    assert git(project, "branch", "--list").split() == ["*", "main"]

    change_the_template(newer, "a newer template")
    conflicting = project / "configs/base.yaml"
    conflicting.write_text(conflicting.read_text().replace("total_steps: 400", "total_steps: 300", 1))
    (project / "notes.md").write_text("ours\n")
    result = make_template_update(project)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "error: the work tree has uncommitted changes" in result.stderr
    commit_all(project, "fewer steps")

    result = make_template_update(project)
    assert result.returncode != 0, result.stdout + result.stderr
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "conflicts with your edits in: configs/base.yaml --" in error[0], result.stderr
    assert git(project, "rev-parse", "--abbrev-ref", "HEAD").strip() == "template-update"
    assert "<<<<<<<" in conflicting.read_text()
    git(project, "reset", "-q", "--hard")
    git(project, "switch", "-q", "main")
    git(project, "branch", "-q", "-D", "template-update")

    conflicting.write_text(conflicting.read_text().replace("total_steps: 300", "total_steps: 400", 1))
    commit_all(project, "back to the template's steps")
    result = make_template_update(project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Updated on branch template-update" in result.stdout
    assert "total_steps: 500" in conflicting.read_text() and not (project / "scripts/tmux_run.sh").exists()
    assert (project / "notes.md").read_text() == "ours\n"
    assert not git(project, "status", "--porcelain")
    assert json.loads((project / ".cruft.json").read_text())["commit"] == git(newer, "rev-parse", "HEAD").strip()
    assert git(project, "log", "-1", "--format=%s").startswith("Update from the template: ")
    assert git(project, "rev-parse", "--abbrev-ref", "HEAD").strip() == "template-update"
