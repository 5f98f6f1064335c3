"""Reading untrusted JSON payloads (IMDS answers, queue messages) with one-line errors.

Each caller passes its own exception class, so an IMDS answer fails as ``MalformedPayload`` and a
queue message as ``UnreadableEvent``, with the same wording: what was read, what was wrong, and a
short preview of the bad text.
"""

from __future__ import annotations

import json
from typing import Any

PREVIEW_CHARS = 100  # characters of a bad payload quoted in an error


def preview(data: Any) -> str:
    return json.dumps(data, sort_keys=True, default=str)[:PREVIEW_CHARS]


def json_object(text: str, what: str, error: type[Exception]) -> dict[str, Any]:
    """``text`` parsed as a JSON object, or ``error`` naming ``what`` and why."""
    if not isinstance(text, str) or not text.strip():
        raise error(f"{what} is empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise error(f"{what} is not JSON ({err.msg} at char {err.pos}): {text[:PREVIEW_CHARS]!r}") from None
    if not isinstance(data, dict):
        raise error(f"{what} is JSON {type(data).__name__}, expected an object: {text[:PREVIEW_CHARS]!r}")
    return data


def required_string(data: dict[str, Any], key: str, what: str, error: type[Exception]) -> str:
    """The non-blank string ``data[key]`` (stripped), or ``error`` naming the missing key."""
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise error(f"{what} has no string {key!r}: {preview(data)}")
    return value.strip()
