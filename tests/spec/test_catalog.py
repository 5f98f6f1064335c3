from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucloud.catalog import Catalog, get_instance_type, load_catalog, save_catalog
from gpucloud.errors import UserError


def test_bundled_catalog_has_the_gpu_types_the_stacks_use_with_sources_and_date() -> None:
    """The GPU types the shipped stacks and the docs name are in the bundled catalog, which cites its sources."""
    catalog = load_catalog()
    for name in (
        "p4d.24xlarge",
        "p4de.24xlarge",
        "p5.48xlarge",
        "p5e.48xlarge",
        "p5en.48xlarge",
        "g5.xlarge",
        "g6.xlarge",
        "g6e.48xlarge",
    ):
        assert name in catalog.instance_types
    assert "p5.24xlarge" not in catalog.instance_types  # does not exist in EC2
    assert catalog.sources and catalog.notes and catalog.as_of.year >= 2026


@pytest.mark.parametrize(
    ("name", "cards", "max_efa", "gpus"),
    [
        ("p4d.24xlarge", 4, 4, 8),
        ("p5.48xlarge", 32, 32, 8),
        ("p5en.48xlarge", 16, 16, 8),
        ("g5.xlarge", 1, 0, 1),
        ("g6.12xlarge", 1, 1, 4),
    ],
)
def test_network_facts(name: str, cards: int, max_efa: int, gpus: int) -> None:
    itype = get_instance_type(name)
    assert len(itype.network_cards) == cards
    assert itype.max_efa_interfaces == max_efa
    assert itype.efa_supported == (max_efa > 0)
    assert itype.gpus == gpus


def test_unknown_type_lists_known_types() -> None:
    with pytest.raises(UserError) as err:
        get_instance_type("p5.24xlarge")
    assert "unknown instance type 'p5.24xlarge'" in str(err.value)
    assert "p5.48xlarge" in str(err.value) and "\n" not in str(err.value)


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    catalog = load_catalog()
    path = tmp_path / "sub" / "catalog.json"
    save_catalog(catalog, path)
    assert load_catalog(path) == catalog
    assert not list(path.parent.glob(".*.tmp"))  # the temp file was renamed into place


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "not a readable JSON catalog"),
        (
            json.dumps({"as_of": "2026-01-01", "region": "us-east-1", "sources": []}),
            "invalid catalog at instance_types",
        ),
        (
            json.dumps({"as_of": "yesterday", "region": "x", "sources": [], "instance_types": {}}),
            "invalid catalog at as_of",
        ),
    ],
)
def test_corrupt_catalog_is_a_one_line_error(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "catalog.json"
    path.write_text(content)
    with pytest.raises(UserError) as err:
        load_catalog(path)
    assert expected in str(err.value) and str(path) in str(err.value)


def test_missing_catalog_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="catalog file not found"):
        load_catalog(tmp_path / "nope.json")


def test_catalog_rejects_unknown_fields() -> None:
    raw = json.loads(load_catalog().model_dump_json())
    raw["instance_types"]["g6.xlarge"]["gpu"] = 1
    with pytest.raises(ValueError):
        Catalog.model_validate(raw)
