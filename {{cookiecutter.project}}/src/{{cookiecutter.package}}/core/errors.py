"""Errors a user can cause, and the one-line way they are reported.

Anything a user can get wrong (a config key, a data directory, the machine) raises `UserError`
with a message that says what is wrong and how to fix it. The command-line entry points wrap
their `main` in `run_cli`, which prints that message on one line instead of a traceback; so too a
permission error from Cloud Storage, with the bucket and the identity (see gcp.py).
"""

from __future__ import annotations

import sys
from typing import Callable, Sequence


class UserError(Exception):
    """A problem the user can fix; the message names it and says how."""


def run_cli(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None) -> None:
    """Runs `main(argv)` and exits with its status; a UserError becomes one line on stderr."""
    try:
        status = main(argv)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except Exception as error:
        from .gcp import denied_message

        message = denied_message(error)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    sys.exit(status or 0)
