import json
import sys
from pathlib import Path

import pytest

from gpucloud.checkpoint import layout
from gpucloud.checkpoint.manifest import FileEntry, Manifest, ManifestError, file_digest, verify_directory
from gpucloud.errors import UserError


def test_parse_uri_forms(tmp_path):
    assert layout.parse_uri(str(tmp_path)) == layout.LocalLocation(tmp_path)
    assert layout.parse_uri(f"file://{tmp_path}") == layout.LocalLocation(tmp_path)
    s3 = layout.parse_uri("s3://my-bucket/runs/exp1/")
    assert s3 == layout.S3Location("my-bucket", "runs/exp1")
    assert s3.key("job", "LATEST") == "runs/exp1/job/LATEST"
    assert layout.S3Location("b-1", "").key("job") == "job"


@pytest.mark.parametrize(
    "uri, message",
    [
        ("", "checkpoint URI is empty"),
        ("gs://bucket/x", "scheme 'gs' is not supported"),
        ("s3://Bad_Bucket/x", "not a valid S3 bucket name"),
        ("file://host/dir", "file:// URIs must name a local path"),
    ],
)
def test_bad_uris_are_one_line_user_errors(uri, message):
    with pytest.raises(UserError, match=message) as info:
        layout.parse_uri(uri)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("job_id", ["", "../x", "a/b", "-lead", "x" * 129, "j1\n"])
def test_bad_job_ids(job_id):
    with pytest.raises(UserError, match="not usable in a checkpoint path"):
        layout.validate_job_id(job_id)


def test_step_dir_names_round_trip_and_reject_lookalikes():
    assert layout.parse_step_dir(layout.step_dir(120)) == 120
    for name in ["step-", "step-01", "step-1a", ".tmp-step-3-a0", "step--1", "LATEST"]:
        assert layout.parse_step_dir(name) is None


def _manifest_for(directory: Path, names: list[str]) -> Manifest:
    files = []
    for name in names:
        size, digest = file_digest(directory / name)
        files.append(FileEntry(name=name, size=size, xxh3=digest))
    return Manifest(job_id="j", step=1, world_size=1, attempt=0, files=files)


def test_verify_detects_missing_truncated_and_flipped_files(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 1000)
    (tmp_path / "b").write_bytes(b"y" * 10)
    manifest = _manifest_for(tmp_path, ["a", "b"])
    verify_directory(tmp_path, manifest)

    data = bytearray((tmp_path / "a").read_bytes())
    data[500] ^= 0x01
    (tmp_path / "a").write_bytes(bytes(data))
    with pytest.raises(ManifestError, match="a checksum .* does not match"):
        verify_directory(tmp_path, manifest)
    verify_directory(tmp_path, manifest, checksums=False)  # same size: only the checksum sees it

    (tmp_path / "b").write_bytes(b"y" * 9)
    with pytest.raises(ManifestError, match="b has 9 bytes, manifest says 10"):
        verify_directory(tmp_path, manifest, checksums=False)
    (tmp_path / "b").unlink()
    with pytest.raises(ManifestError, match="b is missing"):
        verify_directory(tmp_path, manifest, checksums=False)


@pytest.mark.parametrize(
    "text, where",
    [
        (
            b'{"format": "gpucloud-checkpoint/1", "job_id": "j", "step": -1, "world_size": 1, "attempt": 0, "files": []}',
            "step",
        ),
        (b'{"format": "other/9", "job_id": "j", "step": 1, "world_size": 1, "attempt": 0, "files": []}', "format"),
        (
            b'{"format": "gpucloud-checkpoint/1", "job_id": "j", "step": 1, "world_size": 1, "attempt": 0, '
            b'"files": [{"name": "../evil", "size": 1, "xxh3": "0000000000000000"}]}',
            "files.0.name",
        ),
    ],
)
def test_invalid_manifests_name_the_bad_field(text, where):
    with pytest.raises(ManifestError, match=f"invalid manifest \\({where}"):
        Manifest.parse(text, "somewhere")


def test_store_listing_imports_without_torch(tmp_path):
    import subprocess

    code = (
        "import sys\n"
        "from gpucloud.checkpoint.store import latest_committed\n"
        f"assert latest_committed({str(tmp_path)!r}, 'job') is None\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "text, message",
    [
        (b"not json", "manifest is not JSON"),
        (b"[" * 100_000, "manifest is JSON nested too deeply"),
        (b'{"step": ' + b"9" * 5000 + b"}", "manifest is JSON that cannot be read"),
        (b"\xff{}", "manifest is not UTF-8"),
    ],
)
def test_unreadable_manifest_json_is_a_manifest_error(text, message):
    with pytest.raises(ManifestError, match=message):
        Manifest.parse(text, "somewhere")


@pytest.mark.parametrize("name", [".", "..", "manifest.json", "a\x00b"])
def test_manifest_entries_must_be_plain_data_file_names(name):
    text = (
        '{"format": "gpucloud-checkpoint/1", "job_id": "j", "step": 1, "world_size": 1, "attempt": 0, '
        f'"files": [{{"name": {json.dumps(name)}, "size": 1, "xxh3": "0000000000000000"}}]}}'
    )
    with pytest.raises(ManifestError, match="invalid manifest \\(files.0.name"):
        Manifest.parse(text, "somewhere")


def test_a_file_listed_twice_is_invalid():
    entry = '{"name": "a", "size": 1, "xxh3": "0000000000000000"}'
    text = (
        '{"format": "gpucloud-checkpoint/1", "job_id": "j", "step": 1, "world_size": 1, "attempt": 0, '
        f'"files": [{entry}, {entry}]}}'
    )
    with pytest.raises(ManifestError, match="a file is listed twice"):
        Manifest.parse(text, "somewhere")


def test_verify_rejects_files_the_manifest_does_not_list(tmp_path):
    (tmp_path / "a").write_bytes(b"x")
    manifest = _manifest_for(tmp_path, ["a"])
    (tmp_path / "extra").write_bytes(b"y")
    with pytest.raises(ManifestError, match="'extra' is not listed in the manifest"):
        verify_directory(tmp_path, manifest, checksums=False)
    (tmp_path / "extra").unlink()
    (tmp_path / "sub").mkdir()
    with pytest.raises(ManifestError, match="'sub' is not listed in the manifest"):
        verify_directory(tmp_path, manifest)
