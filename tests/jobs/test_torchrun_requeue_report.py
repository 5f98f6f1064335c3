"""A successful preemption does not print torchrun's ChildFailedError traceback.

Ranks that exit 75 (saved, requeue me) make torchrun raise ChildFailedError; its report is replaced
by one line. Any other failure report passes through whole."""

from __future__ import annotations

import io
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import fuzz_settings
from gpucloud.jobs.process_group import ProcessGroup
from gpucloud.jobs.torchrun_output import REPLACEMENT, RequeueReportFilter


def torchrun_report(*exitcodes: int) -> list[str]:
    """torchrun's traceback as Python prints it; the first code is the root cause."""
    failure = "[{i}]:\n  time      : 2026-11-24_05:40:00\n  host      : node\n  rank      : {i} (local_rank: {i})\n"
    failure += "  exitcode  : {code} (pid: 4{i}) \n  error_file: <N/A>\n  traceback : see the docs\n"
    others = "".join(failure.format(i=i, code=c) for i, c in enumerate(exitcodes[1:], 1)) or "  <NO_OTHER_FAILURES>\n"
    text = (
        "Traceback (most recent call last):\n"
        '  File "/venv/bin/torchrun", line 10, in <module>\n'
        "    sys.exit(main())\n"
        "             ^^^^^^\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        + "=" * 40
        + "\ntrain.py FAILED\n"
        + "-" * 40
        + "\nFailures:\n"
        + others
        + "-" * 40
        + "\nRoot Cause (first observed failure):\n"
        + failure.format(i=0, code=exitcodes[0])
        + "=" * 40
        + "\n"
    )
    return text.splitlines(keepends=True)


def filtered(lines: list[str]) -> list[str]:
    report = RequeueReportFilter()
    out = [kept for line in lines for kept in report.feed(line)]
    return out + report.close()


@pytest.mark.parametrize("codes", [(75,), (75, 75), (75, -15), (75, 75, -15)])
def test_a_report_of_requeue_exits_becomes_one_line(codes):
    before, after = ["step 9\n"], ["gpucloud: requeued\n"]
    assert filtered(before + torchrun_report(*codes) + after) == before + [REPLACEMENT] + after


@pytest.mark.parametrize("codes", [(1,), (75, 1), (-15, 75), (-9,), (75, 75, 2)])
def test_any_other_report_passes_through_whole(codes):
    lines = ["step 9\n", *torchrun_report(*codes), "after\n"]
    assert filtered(lines) == lines


def test_other_tracebacks_and_an_unfinished_report_pass_through_in_order():
    user = ["Traceback (most recent call last):\n", '  File "train.py", line 3\n', "ValueError: bad lr\n", "next\n"]
    assert filtered(user) == user
    cut = torchrun_report(75)[:-3]  # the process died mid-report: nothing is lost
    assert filtered(cut) == cut


def test_torchruns_log_line_for_a_requeue_exit_is_left_out_and_others_are_kept():
    line = "E1124 05:40:00.1 42 torch/distributed/elastic/multiprocessing/api.py:1003] failed (exitcode: {}) "
    line += "local_rank: 0 (pid: 43) of binary: /usr/bin/python3\n"
    assert filtered([line.format(75)]) == []
    assert filtered([line.format(1)]) == [line.format(1)]


def run_real_torchrun(rank_exit: int) -> tuple[int, str]:
    sink = io.StringIO()
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--no-python"]
    group = ProcessGroup([*argv, sys.executable, "-c", f"raise SystemExit({rank_exit})"], env=_env(), sink=sink)
    code = group.wait(timeout=120)
    group.close()
    return code, sink.getvalue()


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "OMP_NUM_THREADS": "1"}


def test_real_torchrun_whose_ranks_exit_75_prints_no_child_failed_error():
    code, output = run_real_torchrun(75)
    assert code != 0  # torchrun itself still exits non-zero; spot-train reads the control files
    assert "ChildFailedError" not in output and "Traceback" not in output and "exitcode: 75" not in output, output
    assert output.count(REPLACEMENT) == 1, output


def test_real_torchrun_whose_ranks_crash_still_prints_its_report():
    code, output = run_real_torchrun(3)
    assert code != 0 and "ChildFailedError" in output and "exitcode  : 3" in output, output
    assert REPLACEMENT not in output


_PIECES = [
    "Traceback (most recent call last):\n",
    '  File "x.py", line 1\n',
    "    ^^^^\n",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n",
    "=" * 40 + "\n",
    "=" * 12 + "\n",
    "Root Cause (first observed failure):\n",
    "  exitcode  : 3 (pid: 1) \n",
    "  exitcode  : 75 (pid: 2) \n",
    "ValueError: bad\n",
    "\n",
    "step 7\n",
]


@given(st.lists(st.sampled_from(_PIECES) | st.text(max_size=20).map(lambda t: t.replace("\n", " ") + "\n")))
@fuzz_settings()
def test_fuzz_output_is_passed_whole_and_in_order_unless_a_whole_requeue_report_was_replaced(lines):
    out = filtered(lines)
    if REPLACEMENT not in out:
        assert out == lines  # nothing lost, nothing reordered
    kept = iter(lines)  # what is left besides replacements comes in the input's order
    assert all(any(line == seen for seen in kept) for line in out if line != REPLACEMENT)


@given(st.lists(st.sampled_from([75, 75, -15, 1, 3, -9]), min_size=1, max_size=5), st.lists(st.sampled_from(_PIECES)))
@fuzz_settings()
def test_fuzz_a_report_with_any_other_exit_is_never_hidden(codes, noise):
    lines = [*noise, *torchrun_report(*codes)]
    out = filtered(lines)
    hidden = codes[0] == 75 and all(code in (75, -15) for code in codes)
    if not hidden:
        assert REPLACEMENT not in out and out == lines
    elif not noise:
        assert out == [REPLACEMENT]
