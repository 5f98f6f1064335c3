"""Each check against healthy P4d/P5 captures, then against the broken variant that trips it."""

import pytest

from gpucloud.doctor import capture as cap
from gpucloud.doctor import checks
from gpucloud.doctor.checks import CHECKS, overall, run_checks

from .conftest import capture, expect, with_output


def _by_name(results):
    return {r.check: r for r in results}


@pytest.mark.parametrize(("fixture", "instance_type"), [("p4d-healthy", "p4d.24xlarge"), ("p5-healthy", "p5.48xlarge")])
def test_healthy_nodes_pass_every_check(fixture, instance_type):
    results = run_checks(capture(fixture), expect(instance_type))
    assert len(results) == len(CHECKS) == 16
    # These hand-written captures predate the `nvidia-smi -q -x` capture (tests/fixtures/real has a real one).
    not_passed = [(r.check, r.status, r.observed) for r in results if r.status != "pass"]
    assert not_passed == [("GPU memory health", "skip", "nvidia-smi -q -x not available")]
    assert overall(results) == "pass"


def test_p5_capture_against_p5en_expects_16_efa_devices(p5):
    result = checks.efa_device_count(p5, expect("p5en.48xlarge"))
    assert result.status == "fail" and result.observed == "32" and result.expected.startswith("16")


@pytest.mark.parametrize(
    ("check", "key", "broken", "status", "in_observed", "in_fix"),
    [
        (checks.gpu_count, cap.NVIDIA_SMI_QUERY, "nvidia-smi-query-7-gpus.csv", "fail", "7", "stop/start"),
        (
            checks.gpu_count,
            cap.NVIDIA_SMI_QUERY,
            "nvidia-smi-driver-gone.txt",
            "fail",
            "couldn't communicate",
            "NVIDIA driver",
        ),
        (checks.gpu_count, cap.NVIDIA_SMI_QUERY, None, "fail", "nvidia-smi not found", "driver"),
        (checks.gpu_model, cap.NVIDIA_SMI_QUERY, "nvidia-smi-query-g5.csv", "fail", "NVIDIA A10G", "launch template"),
        (
            checks.driver_supports_toolkit,
            cap.CUDA_VERSION_JSON,
            "cuda-version-13.1.json",
            "fail",
            "toolkit 13.1.0",
            "upgrade the driver",
        ),
        (
            checks.driver_supports_toolkit,
            cap.NVIDIA_SMI,
            "nvidia-smi-old-driver.txt",
            "fail",
            "driver CUDA 12.4, toolkit 13.0.2",
            "upgrade the driver",
        ),
        (
            checks.driver_supports_toolkit,
            cap.NVIDIA_SMI,
            "nvidia-smi-driver-gone.txt",
            "fail",
            "no 'Driver Version",
            "driver",
        ),
        (
            checks.cuda_toolkit_version,
            cap.CUDA_VERSION_JSON,
            "cuda-version-truncated.json",
            "fail",
            "no cuda.version",
            "cuda.sh",
        ),
        (
            checks.cuda_toolkit_version,
            cap.CUDA_VERSION_JSON,
            "cuda-version-13.1.json",
            "fail",
            "13.1.0",
            "rebuild the image",
        ),
        (checks.nccl_version, cap.NCCL_PACKAGE, "nccl-version-old.txt", "fail", "2.18.3-1+cuda12.2", "libnccl2"),
        (checks.nccl_version, cap.NCCL_PACKAGE, None, "fail", "not installed", "libnccl2"),
        (
            checks.efa_installer_version,
            cap.EFA_INSTALLED,
            "efa_installed_packages-old",
            "fail",
            "1.26.1",
            "EFA installer",
        ),
        (
            checks.efa_installer_version,
            cap.EFA_INSTALLED,
            "efa_installed_packages-no-header",
            "fail",
            "no '# EFA",
            "efa.sh",
        ),
        (checks.efa_device_count, cap.FI_INFO_EFA, "fi_info-p4d-3-devices.txt", "fail", "3", "one per network card"),
        (
            checks.efa_device_count,
            cap.FI_INFO_EFA,
            "fi_info-no-efa.txt",
            "fail",
            "fi_getinfo: -61",
            "attach EFA interfaces",
        ),
        (
            checks.nccl_environment,
            cap.ENVIRON,
            "environ-legacy-stack.txt",
            "fail",
            "NCCL_PROTO=simple",
            "unset NCCL_PROTO, FI_EFA_USE_DEVICE_RDMA, RDMAV_FORK_SAFE",
        ),
        (checks.nccl_environment, cap.ENVIRON, "environ-tuning-leftovers.txt", "warn", "NCCL_MIN_CHANNELS=32", "unset"),
        (
            checks.fsx_mounted,
            cap.MOUNTS,
            "proc-mounts-no-fsx.txt",
            "fail",
            "nothing mounted at /fsx",
            "mount -t lustre",
        ),
        (checks.fsx_mounted, cap.MOUNTS, "proc-mounts-fsx-automount.txt", "warn", "automount armed", "ls /fsx"),
        (checks.fsx_mounted, cap.MOUNTS, "proc-mounts-fsx-is-nfs.txt", "fail", "nfs4 at /fsx", "mount -t lustre"),
        (checks.fsx_mounted, cap.MOUNTS, "proc-mounts-garbage.txt", "fail", "mount table line 11", "mount"),
        (
            checks.nvme_scratch,
            cap.LSBLK,
            "lsblk-two-disks-unused.json",
            "warn",
            "8 disks, 6 in use",
            "nvme7n1, nvme8n1",
        ),
        (checks.nvme_scratch, cap.LSBLK, "lsblk-not-json.txt", "fail", "not JSON", "node-bootstrap"),
        (checks.nvme_scratch, cap.MOUNTS, "proc-mounts-garbage.txt", "fail", "mount table line", "node-bootstrap"),
        (checks.imds_token, cap.IMDS, "imds-hop-limit.json", "fail", "no answer within 2s", "hop limit 2"),
        (checks.imds_token, cap.IMDS, "imds-not-json.json", "fail", "imds.json is not", "http-tokens required"),
        (
            checks.agent_running,
            cap.unit_key("gpucloud-agent"),
            "systemctl-failed.txt",
            "fail",
            "gpucloud-agent: failed",
            "journalctl -u gpucloud-agent",
        ),
        (
            checks.agent_running,
            cap.unit_key("gpucloud-agent"),
            "systemctl-activating.txt",
            "warn",
            "activating",
            "systemctl status",
        ),
        (
            checks.fabric_manager_running,
            cap.unit_key("nvidia-fabricmanager"),
            "systemctl-failed.txt",
            "fail",
            "failed",
            "nvidia-fabricmanager",
        ),
        (checks.dcgm_running, cap.unit_key("nvidia-dcgm"), None, "warn", "unknown", "nvidia-dcgm"),
    ],
    ids=lambda v: v.__name__ if callable(v) else None,
)
def test_broken_output_trips_its_check_with_a_fix(p4d, check, key, broken, status, in_observed, in_fix):
    result = check(with_output(p4d, key, broken), expect())
    assert result.status == status, result
    assert in_observed in result.observed, result.observed
    assert in_fix in result.fix, result.fix


def test_old_driver_fails_the_matrix_comparison(p4d):
    node = with_output(p4d, cap.NVIDIA_SMI_QUERY, None)
    outputs = dict(node.outputs)
    outputs[cap.NVIDIA_SMI_QUERY] = p4d.get(cap.NVIDIA_SMI_QUERY).replace("580.105.08", "550.90.07")
    result = checks.driver_version(type(p4d)(outputs), expect())
    assert (result.status, result.observed, result.expected) == ("fail", "550.90.07", "580.105.08")


def test_p5en_with_late_efa_initialisation_fails_until_all_16_appear(p5):
    # p5en is known to enumerate its EFA devices late after boot; doctor reports what it sees now.
    node = with_output(p5, cap.FI_INFO_EFA, "fi_info-p5en-late-init.txt")
    result = checks.efa_device_count(node, expect("p5en.48xlarge"))
    assert (result.status, result.observed) == ("fail", "12") and "p5en may need a few seconds" in result.fix


def test_version_checks_skip_without_a_matrix(p4d):
    results = _by_name(run_checks(p4d, expect(matrix=None)))
    for name in ("NVIDIA driver version", "CUDA toolkit version", "NCCL version", "EFA installer version"):
        assert results[name].status == "skip" and "--matrix" in results[name].fix


def test_type_dependent_checks_skip_without_an_instance_type(p4d):
    results = _by_name(run_checks(p4d, expect(None)))
    assert {results[n].status for n in ("GPU count", "GPU model and memory", "EFA devices", "NVMe scratch")} == {"skip"}
    assert overall(list(results.values())) == "pass"


def test_no_fsx_in_the_stack_skips_the_mount_check(p4d):
    result = checks.fsx_mounted(with_output(p4d, cap.MOUNTS, "proc-mounts-no-fsx.txt"), expect(fsx_mount=None))
    assert result.status == "skip"


def test_dev_box_without_efa_or_nvswitch_skips_those_checks(p4d):
    want = expect("g5.xlarge")
    assert checks.efa_device_count(p4d, want).status == "skip"
    assert checks.efa_installer_version(p4d, want).status == "skip"
    assert checks.fabric_manager_running(p4d, want).status == "skip"


def test_efa_count_falls_back_to_sysfs_listing(p4d):
    node = with_output(p4d, cap.FI_INFO_EFA, None)
    result = checks.efa_device_count(node, expect())
    assert result.status == "pass" and result.observed == "4"


def test_overall_is_the_worst_status(p4d):
    results = run_checks(with_output(p4d, cap.ENVIRON, "environ-tuning-leftovers.txt"), expect())
    assert overall(results) == "warn"
    results = run_checks(with_output(p4d, cap.NVIDIA_SMI_QUERY, "nvidia-smi-query-7-gpus.csv"), expect())
    assert overall(results) == "fail"
