"""Finishes a generated project: records the answers and makes the scripts executable.

The answers go to `.cookiecutter.json` so that the project can be regenerated from a newer
template with the same answers (`cookiecutter --replay-file`, or `cruft`/`cookiecutter` diffs;
see the template README).
"""

import json
import stat
from pathlib import Path

ANSWERS = json.loads(r"""{{ cookiecutter | jsonify }}""")


def main():
    project = Path.cwd()
    answers = {key: value for key, value in ANSWERS.items() if not key.startswith("_")}
    answers["_template"] = ANSWERS.get("_template", "")
    (project / ".cookiecutter.json").write_text(json.dumps(answers, indent=2, sort_keys=True) + "\n")
    for script in (project / "scripts").glob("*.sh"):
        script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    print(f"Generated {project}.")
    print(f"Next: cd {project.name} && make setup && make data preprocess train")


if __name__ == "__main__":
    main()
