"""Shared helpers: the shipped matrix, and copies of it with one thing changed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpucloud.image.matrix import VersionMatrix, parse_matrix

REPO = Path(__file__).resolve().parents[2]
SHIPPED_MATRIX = REPO / "images" / "versions.yaml"


def shipped_raw() -> dict:
    return yaml.safe_load(SHIPPED_MATRIX.read_text())


def matrix_with(base_os: dict | None = None, targets: list[str] | None = None, **versions: str) -> VersionMatrix:
    raw = shipped_raw()
    raw["versions"].update(versions)
    if base_os is not None:
        raw["base_os"].update(base_os)
    if targets is not None:
        raw["targets"] = targets
    return parse_matrix(yaml.safe_dump(raw), "test-matrix.yaml")


@pytest.fixture
def shipped() -> VersionMatrix:
    return parse_matrix(SHIPPED_MATRIX.read_text(), str(SHIPPED_MATRIX))
