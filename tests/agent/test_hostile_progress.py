"""One job's control files must not take down the agent: whatever its ``progress`` (and
``resumed``) file holds, /metrics answers and ``attempt_ended`` returns, at once.

A table of the inputs an attack used (non-UTF-8, integers too large for any store, nesting deeper
than the parser's stack, a FIFO, a device, a directory, a file far too large), and a fuzzer over
JSON documents and raw bytes."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest

from fuzzing import fuzz_settings
from gpucloud import control
from gpucloud.agent.identity import NodeLabels
from gpucloud.agent.metrics import NodeMetrics, registry_for
from gpucloud.training_metrics import SessionMeter

DEADLINE_S = 20.0  # a FIFO would block forever: anything under the deadline is "at once"


def _text(body: str) -> Callable[[Path], None]:
    return lambda path: path.write_text(body)


def _bytes(body: bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(body)


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _directory(path: Path) -> None:
    path.mkdir()


def _loop(path: Path) -> None:
    path.symlink_to(path.name)


def _metrics(**more: object) -> dict:
    payload = SessionMeter().snapshot.to_json()
    payload.update(more)
    return payload


HOSTILE: dict[str, Callable[[Path], None]] = {
    "not UTF-8": _bytes(b'\xff\xfe{"step": 5, "written_at": 1.0}'),
    "integer of 4000 digits (parses)": _text('{"step": 1' + "0" * 4000 + ', "written_at": 1.0}'),
    "integer of 5000 digits (over the parser's limit)": _text('{"step": 1' + "0" * 5000 + "}"),
    "integer of 2**64": _text(json.dumps({"step": 2**64, "written_at": 2.0})),
    "written_at of 4000 digits": _text('{"step": 1, "written_at": 1' + "0" * 4000 + "}"),
    "nested 100000 deep": _text('{"step": 1, "metrics": ' + "[" * 100_000 + "]" * 100_000 + "}"),
    "nested 500 deep": _text('{"step": 1, "written_at": 3.0, "x": ' + "[" * 500 + "]" * 500 + "}"),
    "NaN step": _text('{"step": NaN, "written_at": 4.0}'),
    "Infinity written_at": _text('{"step": 1, "written_at": Infinity}'),
    "1e400 (inf)": _text('{"step": 1, "written_at": 1e400}'),
    "huge histogram counts": _text(
        json.dumps({"step": 1, "written_at": 5.0, "metrics": _metrics(failures=10**30, bytes=10**40)})
    ),
    "a list": _text("[1, 2, 3]"),
    "empty": _text(""),
    "a FIFO": _fifo,
    "a link to /dev/zero": _dev_zero,
    "a directory": _directory,
    "a symlink loop": _loop,
    "2 MiB of JSON": _text(json.dumps({"step": 1, "written_at": 6.0, "pad": "x" * (2 << 20)})),
}


def _node() -> NodeMetrics:
    return NodeMetrics(NodeLabels(instance_id="i-0123456789abcdef0", node_group="p5"))


def _within_deadline(work: Callable[[], None]) -> None:
    """Run ``work`` in a thread; fail (instead of hanging the suite) if it blocks, re-raise its error."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as err:  # noqa: BLE001 - handed to the test thread
            errors.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(DEADLINE_S)
    if thread.is_alive():
        # unblock a reader stuck on a FIFO so the thread can end
        pytest.fail(f"blocked for more than {DEADLINE_S} s")
    if errors:
        raise errors[0]


def _scrape_and_end(node: NodeMetrics, ctl: Path) -> None:
    node.attempt_started("job-1", 1, ctl)
    generate_latest(registry_for(node))
    generate_latest(registry_for(node))
    node.attempt_ended(None)
    generate_latest(registry_for(node))


@pytest.mark.parametrize("name", sorted(HOSTILE))
@pytest.mark.parametrize("file", [control.PROGRESS, control.RESUMED])
def test_a_hostile_control_file_never_stops_metrics_nor_the_attempts_end(tmp_path, name, file) -> None:
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    HOSTILE[name](ctl / file)
    try:
        _within_deadline(lambda: _scrape_and_end(_node(), ctl))
    finally:
        if (ctl / file).is_fifo():  # let a blocked reader go
            fd = os.open(ctl / file, os.O_RDWR | os.O_NONBLOCK)
            os.close(fd)


def test_a_good_progress_file_still_counts(tmp_path) -> None:
    ctl = tmp_path / "ctl"
    control.write(ctl, control.PROGRESS, {"step": 7, "metrics": _metrics()})
    assert control.read(ctl, control.PROGRESS)["step"] == 7
    node = _node()
    node.attempt_started("job-1", 1, ctl)
    assert b'gpucloud_training_step{instance_id="i-0123456789abcdef0",job_id="job-1",node_group="p5"} 7.0' in (
        generate_latest(registry_for(node))
    )


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)
PROGRESS_LIKE = st.fixed_dictionaries(
    {"step": JSON, "written_at": JSON},
    optional={"metrics": JSON | st.just(_metrics()), "last_save": JSON},
)


@fuzz_settings()
@given(doc=st.one_of(PROGRESS_LIKE, JSON), raw=st.none() | st.binary(max_size=200))
def test_fuzzed_progress_files_never_stop_metrics(tmp_path_factory, doc, raw) -> None:
    ctl = tmp_path_factory.mktemp("ctl")
    body = raw if raw is not None else json.dumps(doc).encode()
    (ctl / control.PROGRESS).write_bytes(body)
    _scrape_and_end(_node(), ctl)
