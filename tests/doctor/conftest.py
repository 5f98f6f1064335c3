"""Recorded node captures (fixtures/) and helpers to break one output at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucloud.catalog import get_instance_type
from gpucloud.doctor.capture import NodeCapture
from gpucloud.doctor.checks import Expectations
from gpucloud.doctor.collect import load_recorded
from gpucloud.image.matrix import load_matrix

FIXTURES = Path(__file__).parent / "fixtures"
BROKEN = FIXTURES / "broken"
MATRIX = Path(__file__).resolve().parents[2] / "images" / "versions.yaml"


def capture(name: str) -> NodeCapture:
    return load_recorded(FIXTURES / name)


def with_output(node: NodeCapture, key: str, broken_file: str | None) -> NodeCapture:
    """The capture with one output replaced by a broken fixture (None: the command is missing)."""
    outputs = dict(node.outputs)
    outputs[key] = (BROKEN / broken_file).read_text() if broken_file else None
    return NodeCapture(outputs)


def expect(instance_type: str | None = "p4d.24xlarge", **kw) -> Expectations:
    it = get_instance_type(instance_type) if instance_type else None
    return Expectations(it, kw.pop("matrix", load_matrix(MATRIX)), **kw)


@pytest.fixture
def p4d() -> NodeCapture:
    return capture("p4d-healthy")


@pytest.fixture
def p5() -> NodeCapture:
    return capture("p5-healthy")
