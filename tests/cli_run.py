"""Running the real CLI in the test's process (its click entry point, its one-line errors, its exit codes)."""

from __future__ import annotations

from gpucloud.cli import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``gpucloud ARGV``: its exit code (0 when it returns), stdout and stderr."""
    code: int | str | None = 0
    try:
        main(list(argv))
    except SystemExit as exit_info:
        code = exit_info.code
    out, err = capsys.readouterr()
    return (0 if code is None else code), out, err  # type: ignore[return-value]


def one_line_error(err: str) -> str:
    """The one ``gpucloud: error: ...`` line a bad input gets (and nothing else on stderr)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gpucloud: error: "), err
    return lines[0]
