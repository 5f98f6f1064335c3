"""`gpucloud doctor` end to end: recorded captures, a live collection with fake tools and the IMDS
emulator, and the one-line errors for bad flags."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from cli_run import run_cli as run
from gpucloud.doctor.collect import probe_imds
from gpucloud.offline.imds_emulator import ImdsEmulator

from .conftest import BROKEN, FIXTURES, MATRIX


def test_recorded_healthy_p5_passes(capsys):
    code, out, _ = run(
        capsys, "doctor", "--recorded", str(FIXTURES / "p5-healthy"), "--matrix", str(MATRIX), "-o", "json"
    )
    report = json.loads(out)
    assert code == 0
    assert report["instance_type"] == "p5.48xlarge"  # read from the recorded IMDS answer
    assert report["overall"] == "pass" and len(report["checks"]) == 16


def test_table_output_counts_statuses(capsys):
    code, out, _ = run(capsys, "doctor", "--recorded", str(FIXTURES / "p4d-healthy"), "--matrix", str(MATRIX))
    assert code == 0 and "16 checks: 15 pass, 0 warn, 0 fail, 1 skip" in out


def test_a_failed_check_exits_1(capsys, tmp_path):
    node = tmp_path / "node"
    shutil.copytree(FIXTURES / "p4d-healthy", node)
    shutil.copy(BROKEN / "fi_info-p4d-3-devices.txt", node / "fi_info-efa.txt")
    code, out, _ = run(capsys, "doctor", "--recorded", str(node), "--matrix", str(MATRIX), "-o", "json")
    report = json.loads(out)
    assert code == 1 and report["overall"] == "fail"
    efa = next(c for c in report["checks"] if c["check"] == "EFA devices")
    assert (efa["status"], efa["observed"]) == ("fail", "3") and "network card" in efa["fix"]


def test_none_disables_the_fsx_check(capsys, tmp_path):
    node = tmp_path / "node"
    shutil.copytree(FIXTURES / "p4d-healthy", node)
    shutil.copy(BROKEN / "proc-mounts-no-fsx.txt", node / "proc-mounts.txt")
    code, _, _ = run(capsys, "doctor", "--recorded", str(node), "--matrix", str(MATRIX), "--fsx-mount", "none")
    assert code == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--instance-type", "p9.huge"], "unknown instance type 'p9.huge'; known types:"),
        (["--recorded", "/nonexistent/capture"], "/nonexistent/capture: not a directory of recorded doctor outputs"),
        (["--matrix", "/nonexistent/versions.yaml"], "no such version matrix file"),
    ],
)
def test_user_mistakes_are_one_line_errors(capsys, argv, message):
    code, out, err = run(capsys, "doctor", *argv)
    assert code == 2 and out == ""
    assert err.startswith("gpucloud: error: ") and message in err and err.count("\n") == 1


def test_empty_recorded_directory(capsys, tmp_path):
    code, _, err = run(capsys, "doctor", "--recorded", str(tmp_path))
    assert code == 2 and "no recorded outputs" in err


def _fake_tools(bin_dir: Path, node: Path, **overrides: str) -> None:
    """Stand-ins for nvidia-smi, fi_info, dpkg-query, lsblk and systemctl that print a recorded node."""
    scripts = {
        "nvidia-smi": f'case "$*" in *--query-gpu*) cat "{node}/nvidia-smi-query.csv";; *) cat "{node}/nvidia-smi.txt";; esac',
        "fi_info": f'cat "{node}/fi_info-efa.txt"',
        "dpkg-query": f'cat "{node}/nccl-version.txt"',
        "lsblk": f'cat "{node}/lsblk.json"',
        "systemctl": 'if [ "$2" = gpucloud-agent ]; then echo inactive; exit 3; fi; echo active',
    }
    scripts.update(overrides)
    bin_dir.mkdir()
    for name, body in scripts.items():
        tool = bin_dir / name
        tool.write_text(f"#!/bin/sh\n{body}\n")
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)


def test_live_collection_runs_the_tools_and_asks_imds(capsys, tmp_path, monkeypatch):
    _fake_tools(tmp_path / "bin", FIXTURES / "p4d-healthy")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("NCCL_PROTO", "simple")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-record-me")
    record = tmp_path / "record"
    with ImdsEmulator(instance_type="p4d.24xlarge") as emulator:
        code, out, err = run(
            capsys,
            "doctor",
            "--imds-endpoint",
            emulator.endpoint,
            "--matrix",
            str(MATRIX),
            "--record",
            str(record),
            "-o",
            "json",
        )
    report = json.loads(out)
    checks = {c["check"]: c for c in report["checks"]}
    assert code == 1 and report["instance_type"] == "p4d.24xlarge"
    assert checks["GPU count"]["status"] == "pass"
    assert checks["EFA devices"]["observed"] == "4"
    assert checks["IMDSv2 reachable"]["status"] == "pass"
    assert checks["gpucloud agent running"]["observed"] == "gpucloud-agent: inactive"
    assert checks["NCCL/libfabric environment"]["status"] == "fail"
    # the recorded capture replays to the same verdicts anywhere
    assert (
        "recorded" in err
        and (record / "nvidia-smi-query.csv").read_text()
        == (FIXTURES / "p4d-healthy" / "nvidia-smi-query.csv").read_text()
    )
    assert "do-not-record-me" not in (record / "environ.txt").read_text()
    assert "NCCL_PROTO=simple" in (record / "environ.txt").read_text()
    code, replay, _ = run(capsys, "doctor", "--recorded", str(record), "--matrix", str(MATRIX), "-o", "json")
    assert json.loads(replay)["checks"] == report["checks"]


def test_live_collection_of_failing_tools(capsys, tmp_path, monkeypatch):
    driver_gone = BROKEN / "nvidia-smi-driver-gone.txt"
    _fake_tools(
        tmp_path / "bin",
        FIXTURES / "p4d-healthy",
        **{
            "nvidia-smi": f'cat "{driver_gone}"; exit 9',
            "dpkg-query": "echo 'dpkg-query: no packages found matching libnccl2' >&2; exit 1",
        },
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    with ImdsEmulator(instance_type="p4d.24xlarge") as emulator:
        code, out, _ = run(
            capsys, "doctor", "--imds-endpoint", emulator.endpoint, "--matrix", str(MATRIX), "-o", "json"
        )
    checks = {c["check"]: c for c in json.loads(out)["checks"]}
    assert code == 1
    assert checks["GPU count"]["status"] == "fail" and "couldn't communicate" in checks["GPU count"]["observed"]
    assert checks["NCCL version"]["observed"] == "not installed"


def test_imds_probe_reports_a_missing_token():
    with ImdsEmulator(instance_type="p5en.48xlarge") as emulator:
        assert probe_imds(emulator.endpoint) == {"token_ok": True, "instance_type": "p5en.48xlarge", "error": None}
        # hop limit 1 seen from a container: the token PUT's answer never arrives; IMDSv1 is off
        emulator.hang(1.0, target="token")
        hop = probe_imds(emulator.endpoint, timeout_s=0.2)
        assert hop["token_ok"] is False and hop["error"].startswith("no IMDSv2 token") and "hop limit" in hop["error"]
    # nothing listening: the probe says so instead of hanging or raising
    result = probe_imds(emulator.endpoint)
    assert result["token_ok"] is False and "connection refused" in result["error"]


@pytest.mark.parametrize(
    ("file", "text", "observed"),
    [
        (
            "lsblk.json",
            '{"blockdevices": ' + "[" * 100_000 + "]" * 100_000 + "}",
            "lsblk output is JSON nested too deeply",
        ),
        ("lsblk.json", '{"blockdevices": [{"name": ' + "1" * 5000 + "}]}", "lsblk output is JSON that cannot be read"),
        ("lsblk.json", '{"blockdevices": "nvme0n1"}', "not JSON with a 'blockdevices' list"),
        ("lsblk.json", '{"blockdevices": ["nvme0n1"]}', "a device that is not an object"),
        (
            "lsblk.json",
            '{"blockdevices": [' + '{"name": "a", "children": [' * 30 + "]}" * 30 + "]}",
            "nest more than 16",
        ),
        ("imds.json", "[" * 100_000 + "]" * 100_000, "imds.json is JSON nested too deeply"),
        (
            "imds.json",
            '{"token_ok": true, "instance_type": ' + "9" * 5000 + "}",
            "imds.json is JSON that cannot be read",
        ),
        ("imds.json", '{"token_ok": "yes"}', "imds.json is not {'token_ok': bool"),
        ("cuda-version.json", "[" * 100_000 + "]" * 100_000, "has no cuda.version: it is JSON nested too deeply"),
        ("cuda-version.json", '{"cuda": {"version": ' + "9" * 5000 + "}}", "has no cuda.version: it is JSON that"),
    ],
    ids=[
        "lsblk-deep",
        "lsblk-5000-digits",
        "lsblk-string",
        "lsblk-item-string",
        "lsblk-children-deep",
        "imds-deep",
        "imds-5000-digits",
        "imds-shape",
        "cuda-deep",
        "cuda-5000-digits",
    ],
)
def test_hostile_recorded_output_fails_its_check_not_the_command(capsys, tmp_path, file, text, observed):
    # each was once a RecursionError / ValueError / AttributeError traceback from `doctor --recorded`
    recorded = tmp_path / "capture"
    shutil.copytree(FIXTURES / "p4d-healthy", recorded)
    (recorded / file).write_text(text)
    code, out, err = run(
        capsys,
        "doctor",
        "--recorded",
        str(recorded),
        "--instance-type",
        "p4d.24xlarge",
        "--matrix",
        str(MATRIX),
        "-o",
        "json",
    )
    assert "Traceback" not in err
    report = json.loads(out)
    assert code == 1 and report["overall"] == "fail"
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert failed and all(observed in c["observed"] for c in failed), failed  # only the checks that read it
