"""Bad answers are refused before anything is written, with a line naming variable, value and rule."""

from __future__ import annotations

import json
import re

import pytest
from cookiecutter.exceptions import FailedHookException
from cookiecutter.main import cookiecutter

from conftest import OPTIONS, ROOT, TASKS, TPU_TYPES, bake

GOOD = {"gcp_project": "acme-ml-research", "zone": "us-central2-b", "gcs_bucket": "acme-tpu-data"}

# The rules as the hook words them after "expected": each refusal is the line
# "error: <variable>=<value as Python writes it> is invalid: expected <rule>".
PROJECT_RULE = ("2-40 characters: lowercase letters, digits and single hyphens, starting with a letter and "
                "ending with a letter or digit (it also names the TPU VM), e.g. 'tpu-trainer'")
PACKAGE_RULE = "a Python import name: lowercase letters, digits and underscores, not a Python keyword, e.g. 'tpu_trainer'"
BUCKET_CHARACTERS = ("3-63 characters of lowercase letters, digits, hyphens, underscores and dots, "
                     "starting and ending with a letter or digit")
GCP_PROJECT_RULE = ("a Google Cloud project id: 6-30 characters, lowercase letters, digits and hyphens, "
                    "starting with a letter and not ending with a hyphen, e.g. 'my-ml-project'")
ZONE_RULE = "a Google Cloud zone name such as 'us-central2-b' (region, then '-' and a zone letter)"
TPU_TYPE_RULE = "an accelerator type such as v4-8, v4-32, v5litepod-8, v5p-8 or v6e-8"
# The first task is cookiecutter.json's default; more_tasks may name the other two.
MORE_TASKS_RULE = ("empty, or shipped tasks other than task=image_classification, comma-separated: "
                   "text_classification, language_model")


def refusal(name: str, value: str, rule: str) -> str:
    return f"error: {name}={value!r} is invalid: expected {rule}"


def hook_errors(stderr: str) -> list[str]:
    """The hook's own lines (cookiecutter adds its "Stopping generation" line and a traceback)."""
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


@pytest.mark.parametrize("answer, errors", [
    # A project name also gives the package its default (hyphens to underscores): both are named.
    ({"project": "My_Project"}, [refusal("project", "My_Project", PROJECT_RULE),
                                 refusal("package", "My_Project", PACKAGE_RULE)]),
    ({"project": "9lives"}, [refusal("project", "9lives", PROJECT_RULE), refusal("package", "9lives", PACKAGE_RULE)]),
    ({"project": "trailing-"}, [refusal("project", "trailing-", PROJECT_RULE)]),
    ({"project": "double--hyphen"}, [refusal("project", "double--hyphen", PROJECT_RULE)]),
    ({"project": "a" * 41}, [refusal("project", "a" * 41, PROJECT_RULE)]),
    ({"package": "tpu-trainer"}, [refusal("package", "tpu-trainer", PACKAGE_RULE)]),
    ({"package": "TpuTrainer"}, [refusal("package", "TpuTrainer", PACKAGE_RULE)]),
    # A keyword passes the character rule, but `import class` is a syntax error in every module.
    ({"project": "class"}, [refusal("package", "class", PACKAGE_RULE)]),
    ({"gcs_bucket": "gs://acme-data"}, [refusal("gcs_bucket", "gs://acme-data",
                                                "the bucket name alone, without the gs:// prefix: 'acme-data'")]),
    ({"gcs_bucket": "googbucket"}, [refusal("gcs_bucket", "googbucket", "a bucket name may not start with 'goog'")]),
    ({"gcs_bucket": "my-google-data"}, [refusal("gcs_bucket", "my-google-data",
                                                "a bucket name may not contain 'google' or a look-alike")]),
    ({"gcs_bucket": "my-g00gle-data"}, [refusal("gcs_bucket", "my-g00gle-data",
                                                "a bucket name may not contain 'google' or a look-alike")]),
    ({"gcs_bucket": "Upper"}, [refusal("gcs_bucket", "Upper", BUCKET_CHARACTERS)]),
    ({"gcs_bucket": "ab"}, [refusal("gcs_bucket", "ab", "at least 3 characters")]),
    ({"gcs_bucket": "a" * 64}, [refusal("gcs_bucket", "a" * 64,
                                        "at most 63 characters (222 with dots, each dot-separated part at most 63)")]),
    ({"gcs_bucket": "192.168.1.1"}, [refusal("gcs_bucket", "192.168.1.1", "a bucket name may not be an IP address")]),
    ({"gcs_bucket": "acme.-data"}, [refusal("gcs_bucket", "acme.-data",
                                            "dots may not be adjacent to each other or to a hyphen")]),
    ({"zone": "us-central2"}, [refusal("zone", "us-central2", ZONE_RULE)]),
    ({"gcp_project": "ab"}, [refusal("gcp_project", "ab", GCP_PROJECT_RULE)]),
    ({"gcp_project": "Acme-Project"}, [refusal("gcp_project", "Acme-Project", GCP_PROJECT_RULE)]),
    ({"gcp_project": "my-google-ml"}, [refusal("gcp_project", "my-google-ml",
                                               "a Google Cloud project id may not contain 'google'")]),
    ({"description": "two\nlines"}, [refusal("description", "two\nlines", "one non-empty line")]),
    ({"description": "  "}, [refusal("description", "  ", "one non-empty line")]),
    ({"more_tasks": "regression"}, [refusal("more_tasks", "regression", MORE_TASKS_RULE)]),
    ({"more_tasks": "image_classification"}, [refusal("more_tasks", "image_classification", MORE_TASKS_RULE)]),
    ({"more_tasks": "language_model, language_model"},
     [refusal("more_tasks", "language_model, language_model", MORE_TASKS_RULE)]),
])
def test_bad_answers_are_refused_before_writing(tmp_path, capfd, answer, errors):
    with pytest.raises(FailedHookException):
        bake(tmp_path, **{**GOOD, **answer})
    assert hook_errors(capfd.readouterr().err) == errors
    assert not any(tmp_path.iterdir())  # nothing written


def test_cookiecutter_refuses_a_choice_outside_its_list(tmp_path):
    """Answers given on the command line or in extra_context meet cookiecutter's own check of the
    choice lists, before the hook: the hook's rules for choices are for replayed answers (below)."""
    with pytest.raises(ValueError, match="v4-7 provided for choice variable tpu_type"):
        bake(tmp_path, **GOOD, tpu_type="v4-7")
    assert not any(tmp_path.iterdir())


def replay(tmp_path, **answers) -> list:
    """Generates from a replay file (`cookiecutter --replay-file`), whose answers cookiecutter
    passes to the hooks without checking them against the choice lists; the hook must refuse them.
    Returns what was written to the output folder."""
    defaults = {"project": "tpu-trainer", "package": "tpu_trainer", "description": "A trainer",
                "tpu_type": TPU_TYPES[0], "task": TASKS[0], "more_tasks": ""}
    replay_file = tmp_path / "answers.json"
    replay_file.write_text(json.dumps({"cookiecutter": {**defaults, **GOOD, **answers}, "_cookiecutter": OPTIONS}))
    output = tmp_path / "out"
    output.mkdir()
    with pytest.raises(FailedHookException):
        cookiecutter(str(ROOT), replay=str(replay_file), output_dir=str(output))
    return list(output.iterdir())


@pytest.mark.parametrize("value", ["v4-7", "v4", "v7-8", "tpu-v4-8", "v5e-8", " v4-8"])
def test_the_hook_refuses_an_unknown_tpu_type(tmp_path, capfd, value):
    written = replay(tmp_path, tpu_type=value)
    assert hook_errors(capfd.readouterr().err) == [refusal("tpu_type", value, TPU_TYPE_RULE)]
    assert written == []


@pytest.mark.parametrize("value", ["regression", "Image_Classification", ""])
def test_the_hook_refuses_an_unknown_task(tmp_path, capfd, value):
    written = replay(tmp_path, task=value)
    errors = hook_errors(capfd.readouterr().err)
    assert written == [] and len(errors) == 1, errors
    # The rule lists the tasks cookiecutter.json offers (in the hook's order, compared as a set).
    prefix = re.escape(refusal("task", value, "one of: "))
    listed = re.fullmatch(f"{prefix}([a-z_]+(?:, [a-z_]+)*)", errors[0])
    assert listed and sorted(listed.group(1).split(", ")) == sorted(TASKS), errors[0]


@pytest.mark.parametrize("value", ["tpu-trainer", "2fast", "Trainer", "for"])
def test_the_hook_refuses_a_replayed_package_that_python_cannot_import(tmp_path, capfd, value):
    written = replay(tmp_path, package=value)
    assert hook_errors(capfd.readouterr().err) == [refusal("package", value, PACKAGE_RULE)]
    assert written == []


def test_the_hook_reports_every_bad_answer_at_once(tmp_path, capfd):
    """One run of cookiecutter shows everything to fix, not one answer per attempt."""
    written = replay(tmp_path, tpu_type="v4-7", zone="us-central2", gcs_bucket="ab")
    assert hook_errors(capfd.readouterr().err) == [refusal("zone", "us-central2", ZONE_RULE),
                                                  refusal("gcs_bucket", "ab", "at least 3 characters"),
                                                  refusal("tpu_type", "v4-7", TPU_TYPE_RULE)]
    assert written == []
