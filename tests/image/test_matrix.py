import pytest
import yaml

from gpucloud.errors import UserError
from gpucloud.image.matrix import VERSION_KEYS, load_matrix, parse_matrix

from .conftest import SHIPPED_MATRIX, shipped_raw


def test_shipped_matrix_loads_every_key(shipped):
    assert set(shipped.as_env()) == {f"GPUCLOUD_{k.upper()}" for k in VERSION_KEYS} | {
        "GPUCLOUD_BASE_OS",
        "GPUCLOUD_ARCH",
    }
    assert shipped.as_env()["GPUCLOUD_NVIDIA_DRIVER"] == shipped.versions.nvidia_driver


def _error(raw) -> str:
    text = raw if isinstance(raw, str) else yaml.safe_dump(raw)
    with pytest.raises(UserError) as err:
        parse_matrix(text, "m.yaml")
    message = str(err.value)
    assert "\n" not in message
    return message


def test_missing_file_names_it(tmp_path):
    with pytest.raises(UserError, match=r"nope\.yaml: no such version matrix file"):
        load_matrix(tmp_path / "nope.yaml")


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(UserError, match="cannot read the version matrix"):
        load_matrix(tmp_path)


def test_invalid_yaml_names_the_line():
    assert _error("versions:\n  cuda: '13.0'\n bad\n").startswith("m.yaml: not valid YAML at line 3, column 2:")


def test_not_a_mapping():
    assert "expected a mapping" in _error("- just\n- a list\n")


def test_unquoted_version_read_as_number_is_refused():
    raw = shipped_raw()
    raw["versions"]["lustre_client"] = 2.10  # YAML would silently make this 2.1
    assert _error(raw) == "m.yaml: versions.lustre_client: write the version in quotes (2.1 was read as a number)"


def test_unknown_version_key_lists_allowed_keys():
    raw = shipped_raw()
    raw["versions"]["tensorflow"] = "2.15"
    message = _error(raw)
    assert message.startswith("m.yaml: versions.tensorflow: unknown key")
    assert "nvidia_driver" in message


def test_missing_key():
    raw = shipped_raw()
    del raw["versions"]["nccl"]
    assert _error(raw) == "m.yaml: versions.nccl: is required"


def test_bad_version_string():
    raw = shipped_raw()
    raw["versions"]["cuda"] = "thirteen"
    assert "versions.cuda: 'thirteen' is not a version" in _error(raw)


def test_unsupported_base_os():
    raw = shipped_raw()
    raw["base_os"]["version"] = "20.04"
    message = _error(raw)
    assert "base_os.version" in message and "'22.04'" in message and "'24.04'" in message


def test_empty_targets():
    raw = shipped_raw()
    raw["targets"] = []
    assert "targets" in _error(raw)


def test_file_is_left_untouched_by_loading(tmp_path):
    copy = tmp_path / "versions.yaml"
    copy.write_text(SHIPPED_MATRIX.read_text())
    before = copy.read_bytes()
    load_matrix(copy)
    assert copy.read_bytes() == before


def test_errors_quote_a_bounded_value_on_one_line():
    # before: a problem quoted the whole bad value, and a key with a line break split the message
    message = _error("schema_version: '" + "9" * 100_000 + "'\n")
    assert "schema_version: '9999" in message and len(message) < 300
    assert "\n" not in _error('schema_version: 1\n"bad\\nkey": 1\n')
