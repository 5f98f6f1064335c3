"""`gpucloud image check|render` through the real CLI entry point (exit codes, one-line errors)."""

import json
import shutil

import pytest
import yaml

from cli_run import run_cli as run

from .conftest import REPO, SHIPPED_MATRIX, shipped_raw


def test_check_shipped_matrix_passes(capsys):
    code, out, _ = run(capsys, "image", "check", "--matrix", str(SHIPPED_MATRIX))
    assert code == 0
    assert "18 rules, 0 failed, matrix is compatible" in out


def test_check_json_lists_every_rule(capsys):
    code, out, _ = run(capsys, "image", "check", "--matrix", str(SHIPPED_MATRIX), "--output", "json")
    report = json.loads(out)
    assert code == 0 and report["failed"] == 0 and len(report["rules"]) == 18
    assert {r["status"] for r in report["rules"]} == {"pass"}
    assert [c["name"] for c in report["components"]][:2] == ["gpucloud-10-base", "gpucloud-20-nvidia-driver"]


def test_check_broken_matrix_exits_1_and_names_the_clash(capsys, tmp_path):
    raw = shipped_raw()
    raw["versions"]["nvidia_driver"] = "570.124.06"
    broken = tmp_path / "versions.yaml"
    broken.write_text(yaml.safe_dump(raw))
    code, out, _ = run(capsys, "image", "check", "--matrix", str(broken), "-o", "json")
    report = json.loads(out)
    assert code == 1 and report["failed"] >= 1
    clash = next(r for r in report["rules"] if r["status"] == "fail")
    assert "570.124.06" in clash["detail"] and "13.0.2" in clash["detail"]


def test_unreadable_matrix_is_a_one_line_error(capsys, tmp_path):
    bad = tmp_path / "versions.yaml"
    bad.write_text("schema_version: 1\nversions: [\n")
    code, out, err = run(capsys, "image", "check", "--matrix", str(bad))
    assert code == 2 and out == ""
    assert err.startswith("gpucloud: error: ") and err.count("\n") == 1 and "not valid YAML" in err


def test_check_catches_a_malformed_component_document(capsys, tmp_path):
    images = tmp_path / "images"
    shutil.copytree(REPO / "images", images)
    (images / "components" / "30-cuda.yaml").write_text("name: gpucloud-30-cuda\nschemaVersion: 1.0\nphases: []\n")
    code, _, err = run(capsys, "image", "check", "--matrix", str(SHIPPED_MATRIX), "--images-dir", str(images))
    assert code == 2 and "30-cuda.yaml: phases must be a non-empty list" in err


def test_render_writes_the_documents(capsys, tmp_path):
    code, out, _ = run(capsys, "image", "render", "--matrix", str(SHIPPED_MATRIX), "--out", str(tmp_path / "out"))
    assert code == 0 and "wrote 8 component documents" in out
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written[-1] == "versions.env" and len(written) == 9
    assert yaml.safe_load((tmp_path / "out" / "gpucloud-40-efa.yaml").read_text())["schemaVersion"] == 1.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("schema_version: 1\nversions: " + "[" * 2000 + "]" * 2000 + "\n", "nested more than 64 levels deep"),
        # 1000 levels: deep enough to refuse, small enough to stay under the 1 MiB cap on YAML files
        ("".join(" " * i + f"k{i}:\n" for i in range(1000)) + " " * 1000 + "v\n", "nested more than 64 levels deep"),
        ("schema_version: 1\nschema_version: 2\n", "duplicate key 'schema_version'"),
        ("schema_version: " + "1" * 5000 + "\n", "cannot read the value"),
        (
            "a: &a [x]\n"
            + "".join(
                f"b{i}: &b{i} [" + ",".join([f"*{'a' if i == 0 else f'b{i - 1}'}"] * 9) + "]\n" for i in range(8)
            ),
            "expands to more than",
        ),
    ],
    ids=["deep-flow", "deep-block", "duplicate-key", "huge-integer", "alias-bomb"],
)
def test_hostile_matrix_is_a_one_line_error(capsys, tmp_path, text, expected):
    # deep YAML once gave a RecursionError traceback from `image check`
    bad = tmp_path / "versions.yaml"
    bad.write_text(text)
    code, out, err = run(capsys, "image", "check", "--matrix", str(bad))
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.count("\n") == 1 and expected in err and "at line" in err


def test_deep_component_document_is_a_one_line_error(capsys, tmp_path):
    images = tmp_path / "images"
    shutil.copytree(REPO / "images", images)
    (images / "components" / "30-cuda.yaml").write_text("phases: " + "[" * 3000 + "]" * 3000 + "\n")
    code, _, err = run(capsys, "image", "check", "--matrix", str(SHIPPED_MATRIX), "--images-dir", str(images))
    assert code == 2 and err.count("\n") == 1 and "30-cuda.yaml: not valid component document YAML" in err
