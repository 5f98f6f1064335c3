"""Fixtures for the job tests: an isolated GPUCLOUD_HOME (autouse)."""

from __future__ import annotations

from helpers.home import gpucloud_home  # noqa: F401  (autouse: every job test gets its own home)

# The queue tests still import these from here; the shared copies live in tests/helpers.
from helpers.notices import Inbox, spot_notice  # noqa: F401
from helpers.waiting import wait_for  # noqa: F401
