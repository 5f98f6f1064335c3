"""The IMDS emulator's control API on numbers no scenario uses (1e308, 10**400, NaN, Infinity, a
5000-digit integer) and on a Content-Length that is not a length: its documented one-line 400,
never a dropped connection, and the emulator keeps serving. A table over every numeric field
of every control request, and a fuzzer over the number's text."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import fuzz_settings
from gpucloud.offline.imds_emulator import ImdsEmulator

NUMBERS = [
    b"1e308",
    b"-1e308",
    b"1e400",
    b"-1e400",
    b"1" + b"0" * 400,
    b"1" + b"0" * 5000,
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"9007199254740993",
    b"1e-400",
    b"-1",
]
# request -> (its numeric fields, what else it needs)
FIELDS = {
    "spot-interruption": (["lead_seconds", "at", "after"], {}),
    "rebalance": (["at", "after"], {}),
    "lifecycle": (["at", "after"], {"state": "Terminated"}),
    "scheduled-event": (["not_before", "not_before_in"], {"code": "system-reboot"}),
    "stale-termination-time": (["seconds_ago"], {}),
    "fault": (["count", "seconds", "status"], {"kind": "hang"}),
}
CASES = [(name, field, number) for name, (fields, _) in FIELDS.items() for field in fields for number in NUMBERS]


@pytest.fixture(scope="module")
def emulator() -> Iterator[ImdsEmulator]:
    with ImdsEmulator() as emu:
        yield emu


def _post(emu: ImdsEmulator, name: str, raw: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(f"{emu.endpoint}/gpucloud/emulator/{name}", data=raw, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _body(name: str, field: str, number: bytes) -> bytes:
    _, extra = FIELDS[name]
    rest = "".join(f', "{k}": {json.dumps(v)}' for k, v in extra.items())
    return b'{"' + field.encode() + b'": ' + number + rest.encode() + b"}"


def _still_serving(emu: ImdsEmulator) -> None:
    assert _post(emu, "clear", b"{}")[0] == 200
    with urllib.request.urlopen(f"{emu.endpoint}/gpucloud/emulator/state", timeout=10) as answer:
        json.loads(answer.read())


@pytest.mark.parametrize(("name", "field", "number"), CASES, ids=[f"{n}.{f}={v[:12].decode()}" for n, f, v in CASES])
def test_a_number_out_of_range_is_a_one_line_400(emulator, name, field, number) -> None:
    status, answer = _post(emulator, name, _body(name, field, number))
    assert status in (200, 400), answer
    if status == 400:
        assert "\n" not in answer["error"] and answer["error"].startswith(name)
    _still_serving(emulator)


@pytest.mark.parametrize("declared", [b"-5", b"abc", b"99999999999999999999999999", b"1e3", b"+7"])
def test_a_content_length_that_is_not_a_length_is_a_400(emulator, declared) -> None:
    with socket.create_connection(("127.0.0.1", emulator.port), timeout=10) as conn:
        conn.sendall(
            b"POST /gpucloud/emulator/clear HTTP/1.1\r\nHost: x\r\nContent-Length: " + declared + b"\r\n\r\n{}"
        )
        head = conn.recv(200)
    assert head.startswith(b"HTTP/1.0 400") or head.startswith(b"HTTP/1.1 400"), head
    _still_serving(emulator)


NUMBER_TEXT = st.one_of(
    st.integers(min_value=-(10**600), max_value=10**600).map(lambda n: str(n).encode()),
    st.floats().map(lambda f: json.dumps(f).encode()),
    st.builds(lambda m, e: f"{m}e{e}".encode(), st.integers(-9, 9), st.integers(-999, 999)),
)


@fuzz_settings()
@given(case=st.sampled_from([(n, f) for n, (fields, _) in FIELDS.items() for f in fields]), number=NUMBER_TEXT)
def test_fuzzed_numbers_are_answered_200_or_400(emulator, case, number) -> None:
    name, field = case
    status, answer = _post(emulator, name, _body(name, field, number))
    assert status in (200, 400), answer
    _still_serving(emulator)
