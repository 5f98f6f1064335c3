"""Validation of the identifiers the fleet passes to AWS, so a bad value fails here with one line
instead of as an opaque API error (or, worse, a call about the wrong resource)."""

from __future__ import annotations

import re

from gpucloud.errors import UserError

# EC2 instance ids: "i-" and 8 (older) or 17 hex digits.
_INSTANCE_ID = re.compile(r"i-(?:[0-9a-f]{8}|[0-9a-f]{17})")
_MAX_NAME = 255  # Auto Scaling group and lifecycle hook names: 1 to 255 characters
_HOOK_NAME = re.compile(r"[A-Za-z0-9\-_/]{1,255}")
_TOKEN = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def check_instance_id(value: object, what: str = "instance id") -> str:
    if not isinstance(value, str) or not _INSTANCE_ID.fullmatch(value):
        raise UserError(
            f"{what} {value!r} is not an EC2 instance id (i- and 8 or 17 hex digits, e.g. i-1234567890abcdef0)"
        )
    return value


def check_name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > _MAX_NAME or value != value.strip():
        raise UserError(f"{what} {value!r} is not a valid name (1 to {_MAX_NAME} characters, no surrounding spaces)")
    return value


def check_hook_name(value: object) -> str:
    """Lifecycle hook names: 1 to 255 of A-Z a-z 0-9 - _ / (the API's pattern)."""
    if not isinstance(value, str) or not _HOOK_NAME.fullmatch(value):
        raise UserError(f"lifecycle hook name {value!r} is not valid (1 to 255 of letters, digits, '-', '_', '/')")
    return value


def check_token(value: object) -> str:
    """A lifecycle action token: the API takes exactly 36 characters (a UUID)."""
    if not isinstance(value, str) or not _TOKEN.fullmatch(value):
        raise UserError(
            f"lifecycle action token {value!r} is not a UUID (36 characters, e.g. 87654321-4321-4321-4321-210987654321)"
        )
    return value
