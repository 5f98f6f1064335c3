"""User-facing errors.

A ``UserError`` is a mistake the user can fix (bad stack file, bad flag, unknown job id). The CLI
prints its message as one line on stderr and exits with ``exit_code``; never a traceback.
"""

from __future__ import annotations


def error_line(err: BaseException) -> str:
    """An exception's message as one line (botocore's and the OS's span several), else its type's name."""
    return " ".join(str(err).split()) or type(err).__name__


class UserError(Exception):
    """An error caused by user input; ``str(err)`` is the one-line message shown to the user."""

    exit_code = 2

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
