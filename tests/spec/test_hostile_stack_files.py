"""Stack files written to break the reader: each is refused with one line, exit 2, quickly and in
bounded memory: never a traceback, never an accepted setting the file did not mean. Each attack here
is kept so that the reader stays proof against it."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest
import yaml

from gpucloud.cli import main
from gpucloud.errors import UserError
from gpucloud.spec import load_stack_file
from gpucloud.spec.safe_yaml import load_yaml
from spec.conftest import base_config

REGION = "config:\n  aws:region: us-east-1\n"


def alias_bomb(field: str) -> str:
    """1.9 KB: nine aliases of nine aliases ... of 'lol' (9**8 = 43 million strings once expanded)."""
    levels = "".join(f"  gpucloud:x{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]\n" for i in range(1, 9))
    return REGION + '  gpucloud:x0: &l0 ["lol"]\n' + levels + f"  {field}: *l8\n"


def base_text(**replace: str) -> str:
    text = yaml.safe_dump({"config": base_config()}, sort_keys=False)
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new, 1)
    return text


def plan_error(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--stack-file", str(path), "--output", "json"])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2 and out == "" and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "Pulumi.hostile.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "field", ["gpucloud:costCeilingUsdPerHour", "gpucloud:tags", "gpucloud:nodeGroups", "gpucloud:network"]
)
def test_alias_bomb_is_refused_before_it_expands(tmp_path: Path, field: str) -> None:
    path = write(tmp_path, alias_bomb(field))
    assert len(path.read_bytes()) < 2000
    tracemalloc.start()
    try:
        with pytest.raises(UserError) as err:
            load_stack_file(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(err.value)
    assert "expands to more than 100000 values" in message and "\n" not in message and len(message) < 400
    assert peak < 20 * 2**20  # the expansion would be gigabytes


@pytest.mark.parametrize("value", ["&a [*a]", "&a {b: *a}", "&a [x, [y, *a]]"])
def test_an_alias_inside_its_own_value_is_refused(tmp_path: Path, capsys, value: str) -> None:
    # PyYAML builds a cycle from these; measuring the expansion must not walk it forever
    line = plan_error(write(tmp_path, REGION + f"  gpucloud:network: {value}\n"), capsys)
    assert "at line 3, column 21: an alias refers to the value it is part of" in line


def test_aliases_that_stay_small_are_fine(tmp_path: Path) -> None:
    text = base_text(**{"  gpucloud:tags:\n    team: research\n": "  gpucloud:tags: &t\n    team: research\n"})
    assert load_stack_file(write(tmp_path, text)).tags == {"team": "research"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (REGION + "  gpucloud:network: " + "[" * 500 + "]" * 500 + "\n", "nested more than 64 levels deep"),
        (REGION + "  gpucloud:network: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n", "nested more than 64 levels"),
        (
            REGION + "  gpucloud:network:\n" + "".join(" " * (2 * i + 4) + f"k{i}:\n" for i in range(600)) + "  v\n",
            "nested more than 64 levels deep",
        ),
    ],
    ids=["flow-500", "flow-mappings-5000", "block-600"],
)
def test_deep_nesting_is_refused_with_its_position(tmp_path: Path, capsys, text: str, expected: str) -> None:
    line = plan_error(write(tmp_path, text), capsys)
    assert expected in line and "at line" in line


def test_a_5000_digit_integer_is_refused_with_its_position(tmp_path: Path, capsys) -> None:
    line = plan_error(write(tmp_path, base_text(**{"maxNodes: 2": "maxNodes: " + "1" * 5000})), capsys)
    assert "at line 9, column 15: cannot read the value '1111" in line and "4300 digits" in line


def test_duplicate_keys_are_refused_not_last_one_wins(tmp_path: Path, capsys) -> None:
    # the second ceiling would have replaced the first and let a 67 USD/hour cluster through
    text = base_text() + "  gpucloud:costCeilingUsdPerHour: 100000\n"
    line = plan_error(
        write(tmp_path, text.replace("CostCeilingUsdPerHour: 100\n", "CostCeilingUsdPerHour: 1\n")), capsys
    )
    assert "duplicate key 'gpucloud:costCeilingUsdPerHour' (first at line" in line


def test_duplicate_nested_keys_are_refused(tmp_path: Path, capsys) -> None:
    line = plan_error(write(tmp_path, base_text(**{"maxNodes: 2\n": "maxNodes: 2\n    maxNodes: 900\n"})), capsys)
    assert "duplicate key 'maxNodes'" in line and "at line 10" in line


def test_merge_keys_may_be_overridden(tmp_path: Path) -> None:
    text = base_text(
        **{"  gpucloud:tags:\n    team: research\n": "  gpucloud:tags:\n    <<: {team: x}\n    team: research\n"}
    )
    assert load_stack_file(write(tmp_path, text)).tags == {"team": "research"}


def test_a_nul_byte_is_reported_with_its_position(tmp_path: Path, capsys) -> None:
    line = plan_error(write(tmp_path, base_text(**{"team: research": "team: re\x00search"})), capsys)
    assert line.endswith("not valid YAML at line 31, column 13: unacceptable character #x0000"), line


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"])
def test_an_empty_stack_file_says_so(tmp_path: Path, capsys, text: str) -> None:
    line = plan_error(write(tmp_path, text), capsys)
    assert "the stack file is empty; expected a mapping with a 'config:' section" in line
    assert "NoneType" not in line


def test_a_top_level_list_names_the_kind(tmp_path: Path, capsys) -> None:
    assert "got a list at the top level" in plan_error(write(tmp_path, "- a\n"), capsys)


def test_a_problem_quotes_a_bounded_value(tmp_path: Path, capsys) -> None:
    # a 1 MB value: the line quotes 80 characters of it
    line = plan_error(write(tmp_path, base_text(**{"name: dev": "name: " + "d" * 1_000_000})), capsys)
    assert "gpucloud:nodeGroups[0].name = 'ddd" in line and len(line) < 500


def test_many_problems_are_counted_not_listed(tmp_path: Path, capsys) -> None:
    config = base_config()
    config["gpucloud:tags"] = {f"aws:k{i}": "v" for i in range(500)}
    path = write(tmp_path, yaml.safe_dump({"config": config}))
    with pytest.raises(SystemExit):
        main(["plan", "--stack-file", str(path)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 21 and lines[-1].endswith("... and 481 more problems")  # 500 keys, and their count


@pytest.mark.parametrize("price", ["NaN", "-5", "0", "Infinity"])
def test_a_catalog_with_an_impossible_price_is_refused(tmp_path: Path, capsys, price: str) -> None:
    # a NaN price compares false with the ceiling, a negative one lowers the estimate: both got past it
    catalog = json.loads((Path(__file__).parents[2] / "src/gpucloud/catalog/instance_types.json").read_text())
    catalog["instance_types"]["g6.xlarge"]["on_demand_usd_per_hour"] = "PRICE"
    file = tmp_path / "catalog.json"
    file.write_text(json.dumps(catalog).replace('"PRICE"', price))
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--stack", "dev", "--catalog-file", str(file), "--output", "json"])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2 and out == ""
    assert "invalid catalog at instance_types.g6.xlarge.on_demand_usd_per_hour" in err
    assert len(err.strip().splitlines()) == 1


def test_the_reader_is_the_one_image_uses_too() -> None:
    with pytest.raises(UserError, match="duplicate key 'cuda'"):
        load_yaml("versions:\n  cuda: '12.4'\n  cuda: '13.0'\n", "m.yaml")
