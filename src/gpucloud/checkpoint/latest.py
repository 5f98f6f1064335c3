"""The LATEST pointer: which step is committed, which attempt holds the job, and the manifests'
checksums (pure: parse and format, no I/O).

Format (text, one item per line)::

    step-20                              the committed step ("none": an attempt holds the job, nothing committed yet)
    attempt 3                            the newest attempt that holds the job (the commit fence)
    manifest step-20 0123456789abcdef    XXH3-64 of step-20/manifest.json's exact bytes
    manifest step-15 ...                 ... and of the steps committed before it (at most MAX_MANIFESTS)
    xxh3 89abcdef01234567                XXH3-64 of every byte above this line

Anything else is refused (LatestCorrupt), a bare ``step-20`` included: the checksum line is what
tells the pointer a commit wrote from damage. ``LatestRecord(step=20).render()`` is a valid pointer
to a chosen step (no fence, no manifest checksums), for a person who has to pick one by hand.
"""

from __future__ import annotations

import dataclasses
import re

import xxhash

from gpucloud.checkpoint import layout

MAX_BYTES = 64 * 1024  # far above any LATEST we write; a bigger file is not ours
MAX_MANIFESTS = 16
NONE = "none"
_HEX16 = re.compile(r"^[0-9a-f]{16}$")


class LatestCorrupt(ValueError):
    """LATEST's bytes are not a pointer we wrote; the message shows what it holds."""


@dataclasses.dataclass(frozen=True)
class LatestRecord:
    step: int | None
    attempt: int | None = None
    manifests: dict[int, str] = dataclasses.field(default_factory=dict)

    def manifest_digest(self, step: int) -> str | None:
        return self.manifests.get(step)

    def committed(self, step: int, manifest_digest: str, attempt: int | None) -> LatestRecord:
        """The record after committing ``step``: it names the step, keeps the newest older
        checksums, and the holder becomes ``attempt`` (unchanged when the writer has none)."""
        kept = {s: d for s, d in self.manifests.items() if s < step}
        newest = dict(sorted(kept.items(), reverse=True)[: MAX_MANIFESTS - 1])
        return LatestRecord(
            step=step,
            attempt=self.attempt if attempt is None else attempt,
            manifests={step: manifest_digest, **newest},
        )

    def claimed(self, attempt: int) -> LatestRecord:
        return dataclasses.replace(self, attempt=attempt)

    def render(self) -> str:
        lines = [NONE if self.step is None else layout.step_dir(self.step)]
        if self.attempt is not None:
            lines.append(f"attempt {self.attempt}")
        for step, digest in sorted(self.manifests.items(), reverse=True):
            lines.append(f"manifest {layout.step_dir(step)} {digest}")
        body = "".join(f"{line}\n" for line in lines)
        return f"{body}xxh3 {xxhash.xxh3_64_hexdigest(body.encode())}\n"


def parse(raw: bytes, where: str) -> LatestRecord:
    """Parse LATEST's bytes; LatestCorrupt (one line, shows the start of the bytes) otherwise."""
    if len(raw) > MAX_BYTES:
        raise LatestCorrupt(_corrupt(where, raw, f"{len(raw)} bytes"))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise LatestCorrupt(_corrupt(where, raw)) from None
    lines = text.strip().split("\n")
    if len(lines) < 2:
        raise LatestCorrupt(_corrupt(where, raw, "it has no checksum line"))
    *fields, checksum = lines
    body = "".join(f"{line}\n" for line in fields)
    if checksum != f"xxh3 {xxhash.xxh3_64_hexdigest(body.encode())}":
        raise LatestCorrupt(_corrupt(where, raw, "its checksum line does not match"))
    first, *rest = fields
    step = None if first == NONE else _step(first, where, raw)
    attempt: int | None = None
    manifests: dict[int, str] = {}
    for line in rest:
        key, _, value = line.partition(" ")
        if key == "attempt" and _is_small_int(value):
            attempt = int(value)
        elif key == "manifest" and len(parts := value.split(" ")) == 2 and _HEX16.fullmatch(parts[1]):
            manifests[_step(parts[0], where, raw)] = parts[1]
        else:
            raise LatestCorrupt(_corrupt(where, raw, f"unknown line {line[:40]!r}"))
    return LatestRecord(step=step, attempt=attempt, manifests=manifests)


def _step(name: str, where: str, raw: bytes) -> int:
    step = layout.parse_step_dir(name.strip())
    if step is None:
        raise LatestCorrupt(_corrupt(where, raw))
    return step


def _is_small_int(value: str) -> bool:
    return value.isascii() and value.isdigit() and len(value) <= 18


def _corrupt(where: str, raw: bytes, why: str = "") -> str:
    shown = raw.decode("utf-8", errors="backslashreplace").strip()[:40]
    reason = f"; {why}" if why else ""
    return (
        f"{where}/LATEST is corrupt (contains {shown!r}{reason}); expected 'step-<n>' on its first line and "
        "'xxh3 <checksum>' on its last, as a commit writes it. Delete it to start from scratch, or point it "
        "at a step (docs/checkpoint.md, 'Layout and commit protocol')"
    )
