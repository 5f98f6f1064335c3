"""Fixtures: a real IMDS emulator on 127.0.0.1 (random port) and clients pointed at it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from gpucloud.offline.imds_emulator import ImdsEmulator
from gpucloud.signals.imds import ImdsClient
from gpucloud.signals.poller import ImdsPoller

from .helpers import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def emulator() -> Iterator[ImdsEmulator]:
    with ImdsEmulator() as emu:
        yield emu


@pytest.fixture
def client(emulator: ImdsEmulator) -> ImdsClient:
    # Short timeouts keep fault tests fast; the defaults (1 s / 2 s) are for real nodes.
    return ImdsClient(emulator.endpoint, connect_timeout=0.5, read_timeout=0.3)


@pytest.fixture
def make_poller() -> Callable[..., ImdsPoller]:
    def make(client: ImdsClient, **kwargs) -> ImdsPoller:
        kwargs.setdefault("on_notice", lambda notice: None)
        return ImdsPoller(client, **kwargs)

    return make
