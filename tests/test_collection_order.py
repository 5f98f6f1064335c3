"""tests/conftest.py puts each ``xdist_group`` at the head of the collection, so ``--dist worksteal``
(which steals only from the tail of a worker's queue) keeps a group that shares one costly module
fixture, the Ray cluster, on one worker."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py")


def test_each_xdist_group_goes_first_together_and_the_rest_keep_their_order(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(
        test_a="def test_a1(): pass\ndef test_a2(): pass\n",
        test_b="""
import pytest

@pytest.mark.xdist_group("cluster")
def test_b1(): pass

def test_b2(): pass

@pytest.mark.xdist_group("cluster")
def test_b3(): pass

@pytest.mark.xdist_group(name="other")
def test_b4(): pass
""",
        test_c="def test_c1(): pass\n",
    )
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    collected = [line for line in result.outlines if "::" in line]
    assert collected == [
        "test_b.py::test_b1",
        "test_b.py::test_b3",
        "test_b.py::test_b4",
        "test_a.py::test_a1",
        "test_a.py::test_a2",
        "test_b.py::test_b2",
        "test_c.py::test_c1",
    ], result.outlines
