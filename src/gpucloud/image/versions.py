"""Version strings as the GPU stack writes them, and how to compare them.

The stack mixes styles: ``580.105.08`` (driver), ``13.0.2`` (CUDA), ``2.28.3-1`` (NCCL package
release), ``1.7.4-aws`` (aws-ofi-nccl tag), ``2.15`` (Lustre). A ``Version`` keeps the numeric
release for ordering and the suffix for display; comparisons use the release only, so
``2.28.3-1 >= 2.18.5`` and ``1.7.4-aws >= 1.7.3`` hold.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import total_ordering

_VERSION_RE = re.compile(r"^v?(?P<release>\d+(?:\.\d+){0,3})(?P<suffix>[-+~][0-9A-Za-z.+~-]*)?$")


class VersionError(ValueError):
    """A string that is not a version (the message names it and shows the accepted form)."""


@total_ordering
@dataclass(frozen=True)
class Version:
    release: tuple[int, ...]
    suffix: str = field(default="", compare=False)
    text: str = field(default="", compare=False)  # as written: "580.105.08" keeps its leading zero

    @classmethod
    def parse(cls, text: str) -> Version:
        match = _VERSION_RE.match(str(text).strip())
        if match is None:
            raise VersionError(f"{text!r} is not a version; expected dotted numbers like 12.4, 580.105.08 or 2.28.3-1")
        release = tuple(int(part) for part in match["release"].split("."))
        return cls(release=release, suffix=match["suffix"] or "", text=str(text).strip())

    def _key(self, width: int = 4) -> tuple[int, ...]:
        return self.release + (0,) * (width - len(self.release))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __lt__(self, other: Version) -> bool:
        return self._key() < other._key()

    @property
    def major(self) -> int:
        return self.release[0]

    @property
    def minor(self) -> int:
        return self.release[1] if len(self.release) > 1 else 0

    @property
    def major_minor(self) -> Version:
        return Version((self.major, self.minor))

    def startswith(self, prefix: Version) -> bool:
        """True when this version lies in the series ``prefix`` names (13.0.2 is in 13.0 and in 13)."""
        return self.release[: len(prefix.release)] == prefix.release

    def __str__(self) -> str:
        return self.text or ".".join(str(p) for p in self.release) + self.suffix


def v(text: str) -> Version:
    """Short constructor for version literals in the compatibility tables."""
    return Version.parse(text)
