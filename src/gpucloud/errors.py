"""User-facing errors.

A ``UserError`` is a mistake the user can fix (bad stack file, bad flag, unknown job id). The CLI
prints its message as one line on stderr and exits with ``exit_code``; never a traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """An error caused by user input; ``str(err)`` is the one-line message shown to the user."""

    exit_code = 2

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
