"""A queue file whose tables are not the ones this gpucloud creates (a development build's, another
program's) is refused at open with one line that names what is missing, and is left as it was."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from cli_run import one_line_error
from cli_run import run_cli as run
from gpucloud.errors import UserError
from gpucloud.lifecycle.model import JobSpec
from gpucloud.queue.sqlite import _SCHEMA, SqliteQueue

ONE = JobSpec(command=["python", "train.py"])

# (what the file lacks, the schema it was created with)
OLDER = {
    "column jobs.cancel_requested_at": _SCHEMA.replace(", 'cancelled'", "").replace(
        ",\n    cancel_requested_at REAL", ""
    ),
    "column jobs.last_step": _SCHEMA.replace(
        ",\n    last_step INTEGER,\n    step_rate REAL,\n    progress_at REAL\n);", "\n);", 1
    ),
    "table stop_requests": _SCHEMA[: _SCHEMA.index("-- One stop request per attempt")],
}


def _older_file(path: Path, schema: str) -> None:
    with sqlite3.connect(path) as db:
        db.executescript(schema)
        db.execute("INSERT INTO meta VALUES ('schema_version', '1')")
        db.execute(
            "INSERT INTO jobs (id, spec, state, attempt, created_at, updated_at) VALUES (?, ?, 'queued', 1, 1.0, 1.0)",
            ("old-job", ONE.model_dump_json()),
        )
    db.close()


def _tables(path: Path) -> dict[str, str]:
    with sqlite3.connect(path) as db:
        tables = {str(n): str(sql) for n, sql in db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'")}
    db.close()
    return tables


@pytest.mark.parametrize("lacks", sorted(OLDER))
def test_a_file_with_older_tables_is_one_line_and_left_as_it_was(tmp_path, lacks):
    path = tmp_path / "old.db"
    _older_file(path, OLDER[lacks])
    before = _tables(path)
    with pytest.raises(UserError, match=f"lacks {lacks} ") as refused:
        SqliteQueue(path)
    assert "\n" not in str(refused.value) and "move it away or pick another --queue" in str(refused.value)
    assert _tables(path) == before  # nothing added, nothing edited
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT id FROM jobs").fetchall() == [("old-job",)]
    db.close()


def test_every_command_says_so_in_one_line(capsys, tmp_path):
    path = tmp_path / "old.db"
    _older_file(path, OLDER["table stop_requests"])
    code, _, err = run(capsys, "jobs", "--queue", f"sqlite:///{path}")
    assert code == 2 and "lacks table stop_requests" in one_line_error(err)


def test_a_file_this_gpucloud_created_opens_again(tmp_path):
    path = tmp_path / "q.db"
    SqliteQueue(path).close()
    again = SqliteQueue(path)
    try:
        assert again.submit(ONE).attempt == 1
    finally:
        again.close()
