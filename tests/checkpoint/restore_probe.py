"""Restore each checkpoint URI given on the command line with a fresh TinyJob; print one JSON line
per URI: the restored step, or the error. Run as a subprocess by the permission tests (they drop
root's file-permission override for it)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/, for the shared helpers

from gpucloud.errors import UserError
from helpers.tiny_job import TinyJob


def probe(uri: str) -> dict:
    try:
        return {"step": TinyJob(uri).session.restore()}
    except UserError as exc:
        return {"user_error": str(exc)}
    except BaseException as exc:  # noqa: BLE001 - reported, the test fails on it
        return {"exception": f"{type(exc).__name__}: {exc}"}


if __name__ == "__main__":
    logging.disable(logging.CRITICAL)
    for uri in sys.argv[1:]:
        print(json.dumps(probe(uri)), flush=True)
