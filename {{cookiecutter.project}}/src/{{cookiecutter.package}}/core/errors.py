"""Errors a user can cause, and the one-line way they are reported.

Anything a user can get wrong (a config key, a data directory, the machine) raises `UserError`
with a message that says what is wrong and how to fix it. The command-line entry points wrap
their `main` in `run_cli`, which prints that message on one line instead of a traceback; so too a
permission error from Cloud Storage, with the bucket and the identity that gcp.py resolved.
"""

from __future__ import annotations

import re
import sys
from typing import Callable, Sequence

_BUCKET = re.compile(r"gs://([a-z0-9][a-z0-9._-]{1,220})|/b/([a-z0-9][a-z0-9._-]{1,220})/")

identity: str | None = None
"""Who the Google Cloud credentials belong to, once gcp.require_credentials has resolved them: a
403's message names them."""


class UserError(Exception):
    """A problem the user can fix; the message names it and says how."""


def denied_message(error: BaseException) -> str | None:
    """One line for a 403 from Cloud Storage (Beam's or TensorFlow's), naming bucket and identity;
    None for any other error."""
    text = str(error)
    forbidden = (
        type(error).__name__ in ("Forbidden", "PermissionDeniedError")
        or "403" in text
        and ("Forbidden" in text or "denied" in text or "does not have" in text)
    )
    if not forbidden:
        return None
    match = _BUCKET.search(text)
    bucket = f"gs://{match.group(1) or match.group(2)}" if match else "the bucket"
    who = identity or "these credentials"
    member = f"serviceAccount:{who}" if who.endswith(".gserviceaccount.com") else "user:YOU@example.com"
    return (
        f"{who} may not use {bucket} (403 Forbidden): grant a Storage role on the bucket, e.g. "
        f"gcloud storage buckets add-iam-policy-binding {bucket} --member={member} --role=roles/storage.objectAdmin"
        f", or use a bucket of your own project"
    )


def run_cli(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None) -> None:
    """Runs `main(argv)` and exits with its status; a UserError becomes one line on stderr."""
    try:
        status = main(argv)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except Exception as error:
        message = denied_message(error)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    sys.exit(status or 0)
