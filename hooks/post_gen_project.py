"""Finishes a generated project: keeps only the chosen task, records the answers and makes the
scripts executable.

The template carries every task (src/<package>/tasks/<task>/ and tests/test_<task>.py); a baked
project holds only its own, so no file in it refers to code it does not have.

The answers go to `.cookiecutter.json` so that the project can be regenerated from a newer
template with the same answers (`cookiecutter --replay-file`, or `cruft`/`cookiecutter` diffs;
see the template README).
"""

import json
import shutil
import stat
from pathlib import Path

ANSWERS = json.loads(r"""{{ cookiecutter | jsonify }}""")


TASK = "{{ cookiecutter.task }}"
PACKAGE = "{{ cookiecutter.package }}"


def prune_other_tasks(project: Path) -> None:
    for folder in (project / "src" / PACKAGE / "tasks").iterdir():
        if folder.is_dir() and folder.name != TASK and folder.name != "__pycache__":
            shutil.rmtree(folder)
    for test in (project / "tests").glob("test_task_*.py"):
        if test.name != f"test_task_{TASK}.py":
            test.unlink()


def main():
    project = Path.cwd()
    prune_other_tasks(project)
    answers = {key: value for key, value in ANSWERS.items() if not key.startswith("_")}
    answers["_template"] = ANSWERS.get("_template", "")
    (project / ".cookiecutter.json").write_text(json.dumps(answers, indent=2, sort_keys=True) + "\n")
    for script in (project / "scripts").glob("*.sh"):
        script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    print(f"Generated {project}.")
    print(f"Next: cd {project.name} && make setup && make data preprocess train")


if __name__ == "__main__":
    main()
