"""Shipped stacks planned once per test session under Pulumi mocks (each plan takes ~0.5-1 s)."""

from __future__ import annotations

import pytest

from gpucloud.infra.preview import StackPreview, preview_stack
from gpucloud.spec import available_stacks, load_stack_file, stack_file_for

SHIPPED = ("dev", "p4d-spot", "p5-capacity-block")


@pytest.fixture(scope="session")
def previews() -> dict[str, StackPreview]:
    assert tuple(available_stacks()) == SHIPPED
    return {name: preview_stack(load_stack_file(stack_file_for(name)), name) for name in SHIPPED}
