"""A validation problem: which key, which value, what is allowed. Rendered as one line."""

from __future__ import annotations

import dataclasses
import reprlib
import unicodedata
from typing import Any

_MISSING = object()
MAX_QUOTED_CHARS = 80  # of a bad value or key quoted in a problem
MAX_MESSAGE_CHARS = 600  # a message may list the allowed values, never a whole input
MAX_PROBLEMS = 20  # problems listed for one file; the rest are counted

# repr() of an expanded alias bomb or a 10 MB string is itself the attack: quote a bounded sketch.
_REPR = reprlib.Repr()
_REPR.maxlevel = 3
_REPR.maxstring = MAX_QUOTED_CHARS
_REPR.maxother = MAX_QUOTED_CHARS
_REPR.maxlong = 40
for _limit in ("maxlist", "maxtuple", "maxdict", "maxset", "maxfrozenset", "maxdeque", "maxarray"):
    setattr(_REPR, _limit, 6)


@dataclasses.dataclass(frozen=True)
class Problem:
    key: str  # config key path as the user writes it: gpucloud:nodeGroups[1].capacity.reservationId
    message: str  # what is wrong and what is allowed
    value: Any = _MISSING  # the offending value, when there is one

    def render(self, source: str) -> str:
        shown = "" if self.value is _MISSING else f" = {short_repr(self.value)}"
        message = _shorten(self.message, MAX_MESSAGE_CHARS)
        return one_line(f"{source}: {_shorten(self.key)}{shown}: {message}")


def key_path(*parts: str | int) -> str:
    """``("nodeGroups", 1, "capacity")`` -> ``gpucloud:nodeGroups[1].capacity`` (region is aws:)."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    if out == "region":
        return "aws:region"
    return f"gpucloud:{out}"


def short_repr(value: Any) -> str:
    """``repr(value)`` of at most about ``MAX_QUOTED_CHARS`` characters, computed without a full repr."""
    try:
        text = _REPR.repr(value)
    except ValueError:  # an integer too long for str()
        text = f"<an integer of about {int(value.bit_length() * 0.30103) + 1} digits>"
    return _shorten(text)


def one_line(text: str) -> str:
    """``text`` with line breaks and other control characters escaped: a problem is one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else _escape(c) for c in text)


def _escape(char: str) -> str:
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
    if char in named:
        return named[char]
    if unicodedata.category(char) in ("Zs",):
        return char
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def _shorten(text: str, limit: int = MAX_QUOTED_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
