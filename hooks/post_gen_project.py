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
PACKAGE = "{{ cookiecutter.package }}"


SHARED = ("text", "classification.py")
"""What several tasks share under tasks/ (not a task itself): kept in every bake."""


def prune_other_tasks(project: Path) -> None:
    """Removes the other tasks' packages and tests; the shared task code, tasks/_skeleton (what `make
    new-task` copies) and the core modules beside the packages stay."""
    for path in (project / "src" / PACKAGE / "tasks").iterdir():
        keep = path.name in SHARED or not path.is_dir() or path.name == TASK or path.name.startswith("_")
        if not keep:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    for test in (project / "tests").glob("test_task_*.py"):
        if test.name != f"test_task_{TASK}.py":
            test.unlink()


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
    record_template(project)
    for script in (project / "scripts").glob("*.sh"):
        script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    print(f"Generated {project}.")
    print(f"Next: cd {project.name} && make setup && make data preprocess train")


if __name__ == "__main__":
    main()
