"""Bad answers are refused before anything is written, with a line naming variable, value and rule."""

from __future__ import annotations

import pytest
from cookiecutter.exceptions import FailedHookException

from conftest import bake

GOOD = {"gcp_project": "acme-ml-research", "zone": "us-central2-b", "gcs_bucket": "acme-tpu-data"}


@pytest.mark.parametrize("answer, message", [
    ({"project": "My_Project"}, "project='My_Project' is invalid: expected 2-40 characters: lowercase letters"),
    ({"project": "9lives"}, "project='9lives' is invalid"),
    ({"project": "trailing-"}, "project='trailing-' is invalid"),
    ({"gcs_bucket": "gs://acme-data"}, "gcs_bucket='gs://acme-data' is invalid: expected the bucket name alone, "
                                       "without the gs:// prefix: 'acme-data'"),
    ({"gcs_bucket": "googbucket"}, "gcs_bucket='googbucket' is invalid: expected a bucket name may not start with 'goog'"),
    ({"gcs_bucket": "my-google-data"}, "may not contain 'google'"),
    ({"gcs_bucket": "Upper"}, "gcs_bucket='Upper' is invalid"),
    ({"gcs_bucket": "ab"}, "gcs_bucket='ab' is invalid"),
    ({"gcs_bucket": "a" * 64}, "at most 63 characters"),
    ({"gcs_bucket": "192.168.1.1"}, "may not be an IP address"),
    ({"gcs_bucket": "acme.-data"}, "dots may not be adjacent"),
    ({"zone": "us-central2"}, "zone='us-central2' is invalid: expected a Google Cloud zone name"),
    ({"gcp_project": "ab"}, "gcp_project='ab' is invalid: expected a Google Cloud project id"),
    ({"gcp_project": "Acme-Project"}, "gcp_project='Acme-Project' is invalid"),
    ({"description": "two\nlines"}, "description='two\\nlines' is invalid: expected one non-empty line"),
])
def test_bad_answers_are_refused_before_writing(tmp_path, capfd, answer, message):
    with pytest.raises(FailedHookException):
        bake(tmp_path, **{**GOOD, **answer})
    assert message in capfd.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing written


def test_unknown_tpu_type_is_refused(tmp_path):
    # cookiecutter checks choice lists itself; the hook's rule also covers replayed answers.
    with pytest.raises(ValueError, match="v4-7 provided for choice variable tpu_type"):
        bake(tmp_path, **GOOD, tpu_type="v4-7")
    assert not any(tmp_path.iterdir())


def test_good_answers_pass(tmp_path):
    assert (bake(tmp_path, **GOOD) / "Makefile").exists()
