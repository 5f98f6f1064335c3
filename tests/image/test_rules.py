"""One test per rule that makes it fail, and checks the line names both clashing versions."""

import pytest

from gpucloud.image import rules
from gpucloud.image.rules import RULES, check_matrix, failed

from .conftest import matrix_with


def test_shipped_matrix_passes_every_rule(shipped):
    results = check_matrix(shipped)
    assert len(results) == len(RULES) == 18
    assert [r for r in results if r.status != "pass"] == []


@pytest.mark.parametrize(
    ("rule", "changes", "must_mention"),
    [
        (rules.driver_meets_cuda_toolkit, {"nvidia_driver": "570.124.06"}, ["570.124.06", "580.95.05", "13.0.2"]),
        (
            rules.pytorch_cuda_supported_by_driver,
            {"nvidia_driver": "560.35.05", "cuda": "12.6.3", "pytorch": "2.7.1", "pytorch_cuda": "12.8"},
            ["560.35.05", "12.8", "570.26"],
        ),
        (rules.pytorch_build_published, {"pytorch": "2.9.1", "pytorch_cuda": "12.4"}, ["2.9.1", "12.4", "13.0"]),
        (rules.pytorch_cuda_matches_toolkit, {"pytorch_cuda": "12.8"}, ["12.8", "13.0.2"]),
        (rules.python_supported_by_pytorch, {"python": "3.9"}, ["3.9", "2.9.1", "3.10"]),
        (rules.python_is_base_os_python, {"python": "3.11"}, ["3.11", "24.04", "3.12"]),
        (rules.cudnn_built_for_cuda, {"cudnn": "9.5.1"}, ["9.5.1", "13.0.2", "9.13"]),
        (rules.nccl_built_for_cuda, {"nccl": "2.21.5-1"}, ["2.21.5-1", "13.0.2"]),
        (rules.efa_installer_for_nccl, {"efa_installer": "1.29.0"}, ["2.28.3-1", "1.29.0", "1.29.1"]),
        (rules.lustre_client_for_base_os, {"lustre_client": "2.12"}, ["2.12", "24.04", "2.15"]),
        (rules.p5_minimum_nccl, {"nccl": "2.18.3-1"}, ["2.18.3-1", "2.18.5", "p5.48xlarge"]),
        (rules.p5_minimum_aws_ofi_nccl, {"aws_ofi_nccl": "1.7.2"}, ["1.7.2", "1.7.3", "p5.48xlarge"]),
        (rules.p5_minimum_efa_installer, {"efa_installer": "1.28.0"}, ["1.28.0", "1.29", "p5.48xlarge"]),
        (rules.gpucloud_matches_this_package, {"gpucloud": "9.9.9"}, ["9.9.9", "0.1.0"]),
        (rules.dcgm_exporter_matches_dcgm, {"dcgm_exporter": "3.3.9-3.6.1"}, ["3.3.9-3.6.1", "4.4.2"]),
        (rules.dcgm_exporter_matches_dcgm, {"dcgm_exporter": "4.7.1"}, ["4.7.1", "<DCGM>-<exporter>"]),
    ],
    ids=lambda p: getattr(p, "__name__", None),
)
def test_rule_fails_naming_both_versions(rule, changes, must_mention):
    result = rule(matrix_with(**changes))
    assert result.status == "fail", result
    for text in must_mention:
        assert text in result.detail, (text, result.detail)
    assert result in failed(check_matrix(matrix_with(**changes)))


def test_cuda_not_packaged_for_base_os():
    result = rules.cuda_available_for_base_os(
        matrix_with(
            cuda="12.4.1",
            nvidia_driver="550.90.07",
            pytorch="2.5.1",
            pytorch_cuda="12.4",
            cudnn="9.1.0",
            nccl="2.21.5-1",
        )
    )
    assert result.status == "fail" and "12.4.1" in result.detail and "24.04" in result.detail


def test_p5_cuda_minimum_and_target_driver_rules():
    old = matrix_with(
        cuda="11.8.0",
        pytorch_cuda="11.8",
        pytorch="2.6.0",
        nvidia_driver="520.61.05",
        base_os={"version": "22.04"},
        python="3.10",
        cudnn="8.9.7",
        nccl="2.16.5-1",
        targets=["p5.48xlarge"],
    )
    assert rules.p5_minimum_cuda(old).status == "fail"
    assert "11.8.0" in rules.p5_minimum_cuda(old).detail
    driver = rules.driver_supports_target_gpus(old)
    assert driver.status == "fail" and "H100" in driver.detail and "520.61.05" in driver.detail


def test_p5_minimums_do_not_apply_without_a_p5_target():
    m = matrix_with(nccl="2.18.3-1", targets=["p4d.24xlarge"])
    assert rules.p5_minimum_nccl(m).status == "pass"


@pytest.mark.parametrize(
    ("rule", "changes"),
    [
        (rules.driver_meets_cuda_toolkit, {"cuda": "13.7.0"}),
        (rules.pytorch_build_published, {"pytorch": "3.1.0"}),
        (rules.python_supported_by_pytorch, {"pytorch": "3.1.0"}),
    ],
)
def test_versions_newer_than_the_tables_warn_instead_of_guessing(rule, changes):
    assert rule(matrix_with(**changes)).status == "warn"


def test_unlisted_patch_release_uses_the_series_entry_before_it():
    # 13.0.3 is not in the table: the newest known 13.0.x minimum (13.0.2's) applies.
    result = rules.driver_meets_cuda_toolkit(matrix_with(cuda="13.0.3", nvidia_driver="580.82.07"))
    assert result.status == "fail" and "580.95.05" in result.detail


def test_dcgm_exporter_built_on_a_newer_dcgm_warns():
    result = rules.dcgm_exporter_matches_dcgm(matrix_with(dcgm_exporter="4.5.0-4.8.0"))
    assert result.status == "warn" and "4.4.2" in result.detail
