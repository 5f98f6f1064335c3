"""Fixtures for the job tests: an isolated GPUCLOUD_HOME (autouse)."""

from __future__ import annotations

from helpers.home import gpucloud_home  # noqa: F401  (autouse: every job test gets its own home)
