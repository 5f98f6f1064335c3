"""What a job's text can do to the terminal of whoever reads the queue: nothing. `jobs`, `job show`
and `job logs` (on a terminal) show control sequences escaped, never run them; the log file keeps
the bytes as written, and `job logs` into a pipe passes them on unchanged.

A table of the sequences an attack used, in every field a job controls, and a fuzzer over text."""

from __future__ import annotations

import os
import pty
import select
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from cli_run import run_cli as run
from fuzzing import fuzz_settings
from gpucloud.lifecycle.model import JobSpec
from gpucloud.output import print_table
from gpucloud.queue.sqlite import SqliteQueue

HOSTILE = {
    "OSC 52 (writes the clipboard)": "\x1b]52;c;cm0gLXJmIH4K\x07",
    "OSC 0 (window title)": "\x1b]0;owned\x1b\\",
    "cursor up and erase line": "\x1b[2A\x1b[2K",
    "one-byte CSI": "\x9b2J",
    "bell and backspace": "\x07\x08\x08",
    "carriage return over the line": "ok\rFAKE",
    "bidi override": "\u202eexe.txt",
    "rich markup closing tag": "[/x]",
    "rich markup link": "[link=http://evil]click[/link]",
}
UNSAFE = [chr(c) for c in range(0x20) if chr(c) not in "\n"] + [chr(c) for c in range(0x7F, 0xA0)] + ["\u202e"]


def _no_controls(text: str) -> None:
    found = sorted({repr(ch) for ch in text if ch in UNSAFE})
    assert not found, f"printed raw: {found}"


def _hostile_queue(tmp_path: Path, evil: str) -> tuple[str, str]:
    db = tmp_path / "q.db"
    uri = f"sqlite:///{db}"
    queue = SqliteQueue(db)
    job = queue.submit(JobSpec(command=["python", f"train{evil}.py"], name=f"n{evil}"))
    queue.record(job.id, 1, "exit", data={"exit_code": 1, "reason": evil})
    queue.close()
    with sqlite3.connect(db) as conn:  # as another writer of the shared queue file could leave them
        conn.execute(
            "INSERT INTO events (job_id, attempt, kind, at, data) VALUES (?, 1, ?, ?, '{}')",
            (job.id, f"kind{evil}", time.time()),
        )
        conn.execute("UPDATE jobs SET state = 'failed', reason = ? WHERE id = ?", (f"because{evil}", job.id))
        conn.execute("UPDATE attempts SET state = 'crashed', reason = ? WHERE job_id = ?", (f"crash{evil}", job.id))
    return uri, job.id


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_jobs_and_job_show_print_no_control_sequence(capsys, tmp_path, name) -> None:
    uri, job_id = _hostile_queue(tmp_path, HOSTILE[name])
    for argv in (["jobs", "--queue", uri], ["job", "show", job_id, "--queue", uri]):
        code, out, err = run(capsys, *argv)
        assert code == 0, err
        _no_controls(out + err)
        assert "Traceback" not in err
    code, out, _ = run(capsys, "job", "show", job_id, "--queue", uri, "-o", "json")
    assert code == 0 and f"because{HOSTILE[name]}" in __import__("json").loads(out)["reason"]  # JSON keeps it


def _logs_on_a_terminal(uri: str, job_id: str) -> str:
    """`gpucloud job logs` with its stdout a real terminal (a pty), as a person runs it."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpucloud", "job", "logs", job_id, "--queue", uri],
        stdout=follower,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    os.close(follower)
    chunks = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if ready:
            try:
                data = os.read(leader, 65536)
            except OSError:  # the follower side closed: the command is done
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    proc.wait(timeout=30)
    os.close(leader)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    return b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")


def test_job_logs_on_a_terminal_escapes_sequences_but_the_file_keeps_them(tmp_path, gpucloud_home) -> None:
    uri, job_id = _hostile_queue(tmp_path, "")
    log = gpucloud_home / "logs" / job_id / "attempt-1.log"
    log.parent.mkdir(parents=True)
    body = "".join(f"line {name}: {seq}\n" for name, seq in HOSTILE.items() if seq.isprintable() is False)
    log.write_bytes((body + "step 3\rstep 4\n").encode())
    SqliteQueue(tmp_path / "q.db").record(job_id, 1, "started", data={"log": str(log)})

    shown = _logs_on_a_terminal(uri, job_id)
    assert "\\x1b]52;c;" in shown and "\\x9b2J" in shown and "\\u202e" in shown
    _no_controls(shown.replace("\r", ""))  # a carriage return (progress bars) passes on a terminal
    assert log.read_bytes() == (body + "step 3\rstep 4\n").encode()  # the log keeps the raw bytes

    code = subprocess.run(
        [sys.executable, "-m", "gpucloud", "job", "logs", job_id, "--queue", uri],
        capture_output=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=60,
    )
    assert code.returncode == 0 and "\x1b]52;c;" in code.stdout.decode()  # a pipe gets the bytes


@fuzz_settings()
@given(cells=st.lists(st.text(max_size=30), min_size=1, max_size=4))
def test_fuzzed_cells_print_without_controls_or_errors(cells) -> None:
    console = Console(record=True, width=100, file=open(os.devnull, "w"))  # noqa: SIM115
    print_table("t", [f"c{i}" for i in range(len(cells))], [cells], console=console, markup=False)
    _no_controls(console.export_text(styles=False))
