"""Stack files with explicit YAML tags on values they do not fit, lone surrogates, and sizes no
stack file has: one line naming the file and the position, never a traceback from `plan`.

A table of the tags an attack used, and a fuzzer over every YAML 1.1 tag PyYAML's safe loader
knows, applied to scalars, sequences and mappings in the shipped dev stack."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli_run import run_cli as run
from fuzzing import fuzz_settings
from gpucloud.errors import UserError
from gpucloud.spec import load_stack_file
from gpucloud.spec.loading import STACKS_DIR
from gpucloud.spec.safe_yaml import MAX_TEXT_CHARS

DEV = (STACKS_DIR / "Pulumi.dev.yaml").read_text(encoding="utf-8")
ANCHOR = "aws:region: us-east-1"
TAGS = [
    "bool",
    "int",
    "float",
    "str",
    "null",
    "timestamp",
    "binary",
    "set",
    "map",
    "seq",
    "omap",
    "pairs",
    "merge",
    "value",
]
TAGGED = [
    "!!bool maybe",
    "!!bool ''",
    "!!timestamp garbage",
    "!!timestamp ''",
    "!!int ''",
    "!!float ''",
    "!!int '-'",
    "!!set [1]",
    "!!set 1",
    "!!map [1]",
    "!!map 1",
    "!!omap 1",
    "!!pairs {a: 1}",
    "!!binary '@@'",
    "!!null x",
]


def _with(tmp_path: Path, line: str, key: str = "gpucloud:clusterName") -> Path:
    """The dev stack with ``key: line`` (the dev stack's own setting of ``key`` left out)."""
    kept = DEV.replace("  gpucloud:costCeilingUsdPerHour: 5\n", "")
    if key == "gpucloud:tags":
        kept = kept.replace("  gpucloud:tags:\n    team: ml-platform\n    environment: dev\n", "")
    path = tmp_path / "Pulumi.t.yaml"
    path.write_text(kept.replace(ANCHOR, f"{ANCHOR}\n  {key}: {line}"), encoding="utf-8")
    return path


def _loads_or_one_error(path: Path) -> None:
    try:
        load_stack_file(path)
    except UserError as err:
        assert all(line.startswith(str(path)) for line in str(err).splitlines()), str(err)


@pytest.mark.parametrize("tagged", TAGGED)
@pytest.mark.parametrize("key", ["gpucloud:clusterName", "gpucloud:costCeilingUsdPerHour", "gpucloud:tags"])
def test_an_explicit_tag_that_does_not_fit_is_one_line(tmp_path, tagged, key) -> None:
    _loads_or_one_error(_with(tmp_path, tagged, key))


@pytest.mark.parametrize(
    "line",
    ['{team: "\\ud800"}', '{"\\udfff": x}', '\'{"team": "\\ud800"}\'', '{team: "ok\\udc80ok"}'],
    ids=["yaml escape in a value", "yaml escape in a key", "json escape in a json string", "low surrogate"],
)
def test_a_lone_surrogate_is_refused_before_it_reaches_pulumi(tmp_path, capsys, line) -> None:
    path = _with(tmp_path, line, "gpucloud:tags")
    with pytest.raises(UserError, match="lone surrogate"):
        load_stack_file(path)
    code, _, err = run(capsys, "plan", "--stack-file", str(path))
    assert code == 2 and "lone surrogate" in err and "Traceback" not in err


def test_a_stack_file_far_larger_than_any_is_refused_at_once(tmp_path) -> None:
    path = tmp_path / "Pulumi.big.yaml"
    path.write_text(DEV + "# " + "x" * (20 << 20) + "\n", encoding="utf-8")
    started = time.monotonic()
    with pytest.raises(UserError, match=r"too large|larger than"):
        load_stack_file(path)
    assert time.monotonic() - started < 2.0


def test_a_stack_file_just_under_the_limit_still_loads(tmp_path) -> None:
    path = tmp_path / "Pulumi.padded.yaml"
    padding = "# " + "x" * (MAX_TEXT_CHARS - len(DEV) - 10) + "\n"
    path.write_text(DEV + padding, encoding="utf-8")
    assert load_stack_file(path).region == "us-east-1"


SCALARS = st.sampled_from(
    ["maybe", "''", "garbage", "1", "-", "0x", "2026-13-45", "[1]", "{a: 1}", "[]", "{}", "~", "'@@'"]
)


@fuzz_settings()
@given(tag=st.sampled_from(TAGS) | st.text(alphabet="abcxyz/:", min_size=1, max_size=6), value=SCALARS)
def test_fuzzed_tags_never_escape_as_a_traceback(tmp_path_factory, tag, value) -> None:
    folder = tmp_path_factory.mktemp("tags")
    for key in ("gpucloud:clusterName", "gpucloud:tags", "gpucloud:bogus"):
        _loads_or_one_error(_with(folder, f"!!{tag} {value}", key))
