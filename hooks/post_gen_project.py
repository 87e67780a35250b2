"""Finishes a generated project: keeps only the chosen task, records the template and the answers,
and makes the scripts executable.

The template carries every task (src/<package>/tasks/<task>/ and tests/test_task_<task>.py); a
baked project holds only its own, so no file in it refers to code it does not have. What several
tasks share (the text readers, tokenizer and layers; the classifiers' objective) stays in every bake:
a task added later with `make new-task` may build on it, whatever task the project was baked for.

The template, its commit and the answers go to `.cruft.json`, in the format of cruft, which
`make template-update` uses to bring the project up to a newer template (see the template README).
When cruft itself generates the project (`cruft create`, and the two generations of `cruft update`)
the context carries `_commit` and cruft writes that file; the hook leaves it alone then.
"""

import json
import shutil
import stat
import subprocess
from pathlib import Path

ANSWERS = json.loads(r"""{{ cookiecutter | jsonify }}""")


TASK = "{{ cookiecutter.task }}"
MORE = tuple(name.strip() for name in "{{ cookiecutter.more_tasks }}".split(",") if name.strip())
"""Other shipped tasks the project keeps beside TASK (pre_gen_project.py checked the names)."""
PACKAGE = "{{ cookiecutter.package }}"


SHARED = ("text", "classification.py")
"""What several tasks share under tasks/ (not a task itself): kept in every bake."""


def prune_other_tasks(project: Path) -> None:
    """Removes the packages and tests of the tasks not kept (TASK and MORE); the shared task code,
    tasks/_skeleton (what `make new-task` copies) and the core modules beside the packages stay."""
    kept = (TASK, *MORE)
    for path in (project / "src" / PACKAGE / "tasks").iterdir():
        keep = path.name in SHARED or not path.is_dir() or path.name in kept or path.name.startswith("_")
        if not keep:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    for test in (project / "tests").glob("test_task_*.py"):
        if test.name not in {f"test_task_{name}.py" for name in kept}:
            test.unlink()
    if not {"language_model", "text_classification"} <= set(kept):  # the pretrain-then-fine-tune test needs both
        (project / "tests" / "test_fine_tune_from_the_language_model.py").unlink()


def template_folder() -> Path:
    """The template's folder being generated from. cookiecutter gives it relative to where it was
    started, and runs this hook in the new project: a relative one is read against the starting
    shell's folder ($PWD)."""
    import os

    folder = Path(ANSWERS["_repo_dir"]).expanduser()
    if not folder.is_absolute():
        folder = Path(os.environ.get("PWD", ".")) / folder
    if not (folder / "cookiecutter.json").is_file():
        raise SystemExit(
            f"error: more_tasks needs the template's folder to generate the other tasks' configs, and {folder} "
            "is not it; run cookiecutter with the template's absolute path or its URL"
        )
    return folder.resolve()


def add_more_tasks_configs(project: Path) -> None:
    """configs/<task>/ for each task of MORE: the template's configs generated for that task, with the
    task's own data and run folders (as `make new-task FROM=` gives a copy), so that each task of the
    project trains side by side with the others: `make data preprocess train CONFIG=configs/<task>/local.yaml`."""
    if not MORE:
        return
    import importlib
    import sys
    import tempfile

    from cookiecutter.main import cookiecutter

    sys.path.insert(0, str(project / "src"))
    new_task = importlib.import_module(f"{PACKAGE}.new_task")  # imports no TensorFlow
    answers = {key: value for key, value in ANSWERS.items() if not key.startswith("_")}
    for name in MORE:
        with tempfile.TemporaryDirectory() as scratch:
            generated = cookiecutter(
                str(template_folder()),
                no_input=True,
                output_dir=scratch,
                accept_hooks=False,
                extra_context={**answers, "task": name, "more_tasks": ""},
            )
            folder = project / "configs" / name
            folder.mkdir()
            for path in sorted((Path(generated) / "configs").glob("*.yaml")):
                (folder / path.name).write_text(new_task.with_own_paths(path.read_text(), name))


def template_commit(repo_dir: str) -> str | None:
    """The commit of the template checkout being baked; None when it is not a git checkout."""
    try:
        result = subprocess.run(["git", "-C", repo_dir, "rev-parse", "HEAD"], capture_output=True, text=True)
    except OSError:  # no git
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def template_url(template: str) -> str:
    """What cruft can clone: `gh:org/x` expanded to its URL, a local folder as an absolute path."""
    from cookiecutter.config import BUILTIN_ABBREVIATIONS
    from cookiecutter.repository import expand_abbreviations, is_repo_url

    expanded = expand_abbreviations(template, BUILTIN_ABBREVIATIONS)
    return expanded if is_repo_url(expanded) else str(Path(expanded).expanduser().resolve())


def record_template(project: Path) -> None:
    if "_commit" in ANSWERS:  # cruft is generating: .cruft.json is its to write
        return
    template = template_url(ANSWERS.get("_template", ""))
    commit = template_commit(ANSWERS.get("_repo_dir") or template)
    answers = {key: value for key, value in ANSWERS.items() if not key.startswith("_")}
    state = {
        "template": template,
        "commit": commit,
        "checkout": ANSWERS.get("_checkout"),
        "context": {"cookiecutter": {**answers, "_template": template, "_commit": commit}},
        "directory": None,
    }
    (project / ".cruft.json").write_text(json.dumps(state, ensure_ascii=False, indent=2) + "\n")


def main():
    project = Path.cwd()
    prune_other_tasks(project)
    add_more_tasks_configs(project)
    record_template(project)
    for script in (project / "scripts").glob("*.sh"):
        script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    print(f"Generated {project}.")
    print(f"Next: cd {project.name} && make setup && make data preprocess train")


if __name__ == "__main__":
    main()
