"""The LATEST pointer's format: written and read back, anything else refused (pure)."""

from __future__ import annotations

import pytest
import xxhash

from gpucloud.checkpoint import latest
from gpucloud.checkpoint.latest import LatestCorrupt, LatestRecord


def test_round_trip_and_what_a_commit_keeps():
    record = LatestRecord(step=None, attempt=2)
    for step in range(1, 40):
        record = record.committed(step, f"{step:016x}", 3 if step > 20 else None)
    assert record.step == 39 and record.attempt == 3
    assert sorted(record.manifests) == list(range(39 - latest.MAX_MANIFESTS + 1, 40))
    assert latest.parse(record.render().encode(), "x") == record


def test_a_commit_of_an_older_step_forgets_the_newer_ones():
    record = LatestRecord(step=20, manifests={20: "0" * 16, 15: "1" * 16})
    assert record.committed(16, "2" * 16, None).manifests == {16: "2" * 16, 15: "1" * 16}


def test_a_pointer_rendered_by_hand_names_its_step_without_fence_or_checksums():
    assert latest.parse(LatestRecord(step=12).render().encode(), "x") == LatestRecord(step=12)


@pytest.mark.parametrize("raw", [b"step-12\n", b"  step-12  ", b"none\n", b""])
def test_a_step_name_alone_is_refused_like_any_damage(raw):
    """Without its checksum line a LATEST cannot be told from a damaged one."""
    with pytest.raises(LatestCorrupt) as info:
        latest.parse(raw, "/ck/job")
    message = str(info.value)
    assert "\n" not in message
    assert f"/ck/job/LATEST is corrupt (contains {raw.decode().strip()!r}; it has no checksum line)" in message
    assert "expected 'step-<n>' on its first line and 'xxh3 <checksum>' on its last" in message


@pytest.mark.parametrize(
    "raw, why",
    [
        (b"step-4\nattempt 2\nxxh3 0000000000000000\n", "its checksum line does not match"),
        (b"step-" + b"9" * 19 + b"\n", "contains 'step-9999"),
        (b"step-\xff\n", r"contains 'step-\\\\xff'"),
        (b"x" * (latest.MAX_BYTES + 1), f"{latest.MAX_BYTES + 1} bytes"),
    ],
)
def test_damage_is_refused_in_one_line(raw, why):
    with pytest.raises(LatestCorrupt, match=why) as info:
        latest.parse(raw, "/ck/job")
    assert "\n" not in str(info.value)


def test_an_unknown_line_is_refused_even_with_a_good_checksum():
    body = "step-4\nowner someone\n"
    raw = f"{body}xxh3 {xxhash.xxh3_64_hexdigest(body.encode())}\n".encode()
    with pytest.raises(LatestCorrupt, match="unknown line 'owner someone'"):
        latest.parse(raw, "x")
