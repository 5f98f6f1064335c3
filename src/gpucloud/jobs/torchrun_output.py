"""torchrun's failure report for ranks that exited 75 (checkpointed, requeue me) is not an error.

When its workers exit non-zero, torchrun raises ``ChildFailedError`` out of its ``main``: Python
prints a traceback ending in a "<cmd> FAILED ... exitcode : 75" block, and torchrun's logger an
``failed (exitcode: 75) local_rank: ...`` line. After a successful preemption every rank exits 75
on purpose (``jobenv.EXIT_REQUEUED``), so that block would greet the user as a crash. This filter
sits between the command's output and its sink: it holds a traceback until its exception line is
known, and replaces torchrun's report with one line when the first failing rank exited 75 and
every other listed rank exited 75 too, or was stopped by torchrun's own SIGTERM after the first
one ended. Any other report, and every other line, passes through unchanged and in order.
"""

from __future__ import annotations

import re

from gpucloud.jobenv import EXIT_REQUEUED

TRACEBACK = "Traceback (most recent call last):"
CHILD_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
# torchrun's logger line for the first failed rank (torch/distributed/elastic/multiprocessing/api.py)
REQUEUE_LOG_LINE = re.compile(rf"\] failed \(exitcode: {EXIT_REQUEUED}\) local_rank: \d+ \(pid: \d+\) of binary: ")
EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
ROOT_CAUSE = "Root Cause (first observed failure):"
SIGTERM_EXIT = -15  # torchrun stops the remaining ranks with SIGTERM once one has exited
MAX_HELD_LINES = 2000  # a report this long is not torchrun's: let it through

REPLACEMENT = (
    f"gpucloud: the ranks exited {EXIT_REQUEUED} (saved, requeue me); torchrun reports that as a failure, "
    "left out here\n"
)


class RequeueReportFilter:
    """Feed the command's output line by line (``feed``), then ``close`` at its end; each returns
    the lines to pass on. Lines keep their newline."""

    def __init__(self) -> None:
        self._held: list[str] = []
        self._phase = "pass"  # "pass" | "traceback" | "report"
        self._border: str | None = None

    def feed(self, line: str) -> list[str]:
        text = line.rstrip("\n")
        if self._phase == "pass":
            if text == TRACEBACK:
                self._held, self._phase = [line], "traceback"
                return []
            return [] if REQUEUE_LOG_LINE.search(text) else [line]
        self._held.append(line)
        if len(self._held) > MAX_HELD_LINES:
            return self._release()
        if self._phase == "traceback":
            if text[:1].isspace():
                return []  # a frame of the traceback
            if text.startswith(CHILD_FAILED):
                self._phase, self._border = "report", None
                return []
            return self._release()
        return self._feed_report(text)

    def close(self) -> list[str]:
        return self._release()

    def _feed_report(self, text: str) -> list[str]:
        if not text or set(text) != {"="}:
            return []
        if self._border is None:
            self._border = text
            return []
        if text != self._border:
            return []
        report = self._release()
        return [REPLACEMENT] if only_requeue_exits(report) else report

    def _release(self) -> list[str]:
        held, self._held, self._phase, self._border = self._held, [], "pass", None
        return held


def only_requeue_exits(report: list[str]) -> bool:
    """Whether torchrun's report says: the first failure exited 75, each other one exited 75 or
    got torchrun's SIGTERM (the root cause is listed last, under ``ROOT_CAUSE``)."""
    codes = [int(m.group(1)) for line in report if (m := EXITCODE.match(line))]
    root_at = next((i for i, line in enumerate(report) if line.rstrip("\n") == ROOT_CAUSE), None)
    if not codes or root_at is None:
        return False
    root = [int(m.group(1)) for line in report[root_at:] if (m := EXITCODE.match(line))]
    others = codes[: len(codes) - len(root)]
    return root == [EXIT_REQUEUED] and all(code in (EXIT_REQUEUED, SIGTERM_EXIT) for code in others)
