"""Refuses bad answers before anything is written.

Each rule names the variable, the value given and what a valid value looks like, so that a
wrong answer costs one re-run of cookiecutter, not a failed `make tpu-create` an hour later.
"""

import ipaddress
import keyword
import re
import sys

ANSWERS = {
    "project": {{ cookiecutter.project | tojson }},
    "package": {{ cookiecutter.package | tojson }},
    "description": {{ cookiecutter.description | tojson }},
    "gcp_project": {{ cookiecutter.gcp_project | tojson }},
    "zone": {{ cookiecutter.zone | tojson }},
    "gcs_bucket": {{ cookiecutter.gcs_bucket | tojson }},
    "tpu_type": {{ cookiecutter.tpu_type | tojson }},
    "task": {{ cookiecutter.task | tojson }},
    "more_tasks": {{ cookiecutter.more_tasks | tojson }},
}

TASKS = ("image_classification", "text_classification", "language_model")
# Accelerator types: generation, then the number of TensorCores (v2-v4, v5p) or chips (v5e, v6e).
TPU_TYPE = re.compile(r"^(v2|v3|v4|v5p|v5litepod|v6e)-(1|4|8|16|32|64|128|256|512|1024|2048|4096|8192)$")


def check_project(value):
    if not re.fullmatch(r"[a-z][a-z0-9-]{0,38}[a-z0-9]", value) or "--" in value:
        return ("2-40 characters: lowercase letters, digits and single hyphens, starting with a letter and "
                "ending with a letter or digit (it also names the TPU VM), e.g. 'tpu-trainer'")


def check_package(value):
    # A keyword matches the characters, but `import class` is a syntax error in every module.
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", value) or keyword.iskeyword(value):
        return ("a Python import name: lowercase letters, digits and underscores, not a Python keyword, "
                "e.g. 'tpu_trainer'")


def check_description(value):
    if "\n" in value or not value.strip():
        return "one non-empty line"


def check_gcp_project(value):
    if not re.fullmatch(r"[a-z][a-z0-9-]{4,28}[a-z0-9]", value):
        return ("a Google Cloud project id: 6-30 characters, lowercase letters, digits and hyphens, "
                "starting with a letter and not ending with a hyphen, e.g. 'my-ml-project'")
    if "google" in value:
        return "a Google Cloud project id may not contain 'google'"


def check_zone(value):
    if not re.fullmatch(r"[a-z]+-[a-z]+[0-9]+-[a-z]", value):
        return "a Google Cloud zone name such as 'us-central2-b' (region, then '-' and a zone letter)"


def check_gcs_bucket(value):
    if value.startswith("gs://"):
        return f"the bucket name alone, without the gs:// prefix: '{value[5:].rstrip('/')}'"
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*[a-z0-9]", value):
        return ("3-63 characters of lowercase letters, digits, hyphens, underscores and dots, "
                "starting and ending with a letter or digit")
    if len(value) > 222 or ("." not in value and len(value) > 63):
        return "at most 63 characters (222 with dots, each dot-separated part at most 63)"
    if any(len(part) > 63 or not part for part in value.split(".")):
        return "each dot-separated part is 1-63 characters"
    if len(value) < 3:
        return "at least 3 characters"
    if value.startswith("goog"):
        return "a bucket name may not start with 'goog'"
    if "google" in value or re.search(r"g[o0]{2}g[l1]e", value):
        return "a bucket name may not contain 'google' or a look-alike"
    try:
        ipaddress.ip_address(value)
        return "a bucket name may not be an IP address"
    except ValueError:
        pass
    if ".." in value or ".-" in value or "-." in value:
        return "dots may not be adjacent to each other or to a hyphen"


def check_tpu_type(value):
    if not TPU_TYPE.fullmatch(value):
        return "an accelerator type such as v4-8, v4-32, v5litepod-8, v5p-8 or v6e-8"


def check_task(value):
    if value not in TASKS:
        return f"one of: {', '.join(TASKS)}"


def check_more_tasks(value):
    names = [name.strip() for name in value.split(",") if name.strip()]
    others = [task for task in TASKS if task != ANSWERS["task"]]
    if any(name not in others for name in names) or len(set(names)) != len(names):
        return f"empty, or shipped tasks other than task={ANSWERS['task']}, comma-separated: {', '.join(others)}"


def main():
    failures = []
    for name, value in ANSWERS.items():
        rule = globals()[f"check_{name}"](value)
        if rule:
            failures.append(f"error: {name}={value!r} is invalid: expected {rule}")
    for line in failures:
        print(line, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
