"""Reading untrusted JSON (IMDS answers, queue messages, events, recorded captures) with one-line errors.

Each caller passes its own exception class, so an IMDS answer fails as ``MalformedPayload`` and a
queue message as ``UnreadableEvent``, with the same wording: what was read, what was wrong, and a
short preview of the bad text.
"""

from __future__ import annotations

import json
from typing import Any

PREVIEW_CHARS = 100  # characters of a bad payload quoted in an error


def preview(data: Any) -> str:
    """At most ``PREVIEW_CHARS`` of ``data`` as JSON, for an error message; never raises."""
    try:
        return json.dumps(data, sort_keys=True, default=str)[:PREVIEW_CHARS]
    except (RecursionError, ValueError, TypeError):  # nested too deeply, or keys json cannot sort
        return f"<a JSON {type(data).__name__} too large or too deep to show>"


def parse_json(text: str | bytes, what: str, error: type[Exception]) -> Any:
    """``text`` parsed as JSON, or ``error`` naming ``what`` and why: never another exception.

    Beyond syntax errors, valid JSON can still break the parser: an integer of more digits than
    Python converts (ValueError), nesting deeper than the interpreter's stack (RecursionError).
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise error(f"{what} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise error(f"{what} is not JSON ({err.msg} at char {err.pos}): {text[:PREVIEW_CHARS]!r}") from None
    except RecursionError:
        raise error(f"{what} is JSON nested too deeply to read: {text[:PREVIEW_CHARS]!r}") from None
    except ValueError as err:  # e.g. "Exceeds the limit (4300 digits) for integer string conversion"
        raise error(f"{what} is JSON that cannot be read ({err}): {text[:PREVIEW_CHARS]!r}") from None


def json_object(text: str, what: str, error: type[Exception]) -> dict[str, Any]:
    """``text`` parsed as a JSON object, or ``error`` naming ``what`` and why."""
    if not isinstance(text, str) or not text.strip():
        raise error(f"{what} is empty")
    data = parse_json(text, what, error)
    if not isinstance(data, dict):
        raise error(f"{what} is JSON {type(data).__name__}, expected an object: {text[:PREVIEW_CHARS]!r}")
    return data


def required_string(data: dict[str, Any], key: str, what: str, error: type[Exception]) -> str:
    """The non-blank string ``data[key]`` (stripped), or ``error`` naming the missing key."""
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise error(f"{what} has no string {key!r}: {preview(data)}")
    return value.strip()
