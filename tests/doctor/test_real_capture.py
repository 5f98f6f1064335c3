"""Doctor's parsers and checks on outputs captured on a real GPU host (tests/fixtures/real/h200-vm).

The other fixtures were written by hand from documentation; these came from `gpucloud doctor --record`
and `nvidia-smi -q -x` on a one-GPU H200 virtual machine (driver 580.159.04, CUDA 13.0, no EFA, no
IMDS): the first outputs not written by us.
"""

from pathlib import Path

import pytest

from gpucloud.doctor import capture as cap
from gpucloud.doctor import checks, parsers
from gpucloud.doctor.capture import NodeCapture
from gpucloud.doctor.collect import load_recorded

from .conftest import expect

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "h200-vm"


@pytest.fixture
def h200() -> NodeCapture:
    return load_recorded(REAL)


def test_the_real_outputs_parse(h200):
    [gpu] = parsers.parse_gpu_query(h200.get(cap.NVIDIA_SMI_QUERY) or "")
    assert (gpu.index, gpu.name, gpu.driver_version, gpu.memory_mib, gpu.bus_id) == (
        0,
        "NVIDIA H200",
        "580.159.04",
        143771,
        "00000000:00:06.0",
    )
    assert parsers.parse_smi_banner(h200.get(cap.NVIDIA_SMI) or "") == ("580.159.04", "13.0")
    assert parsers.parse_environ(h200.get(cap.ENVIRON) or "")["NCCL_VERSION"] == "2.28.3-1"
    assert any(m.path == "/" for m in parsers.parse_mounts(h200.get(cap.MOUNTS) or ""))
    assert parsers.parse_lsblk(h200.get(cap.LSBLK) or "")
    assert parsers.parse_smi_xml_memory(h200.get(cap.NVIDIA_SMI_XML) or "") == [
        parsers.GpuMemoryHealth("00000000:00:06.0", remap_pending=False, remap_failure=False, dram_uncorrectable=0)
    ]


def test_the_real_host_is_judged_as_what_it_is(h200):
    """A one-GPU H200 VM checked as a p5en.48xlarge: the model and memory match (143771 MiB usable of
    141 GB), the count does not, the driver is newer than the image's pin, and its memory is healthy."""
    results = {r.check: r for r in checks.run_checks(h200, expect("p5en.48xlarge"))}
    assert results["GPU model and memory"].status == "pass"
    assert results["GPU count"].status == "fail" and results["GPU count"].observed == "1"
    assert results["NVIDIA driver version"].observed == "580.159.04"
    assert results["NCCL version"].status == "pass"
    assert results["GPU memory health"].status == "pass"
    assert results["EFA devices"].status == "fail" and results["EFA devices"].observed == "0"


def _xml(h200: NodeCapture, old: str, new: str) -> NodeCapture:
    text = h200.get(cap.NVIDIA_SMI_XML) or ""
    assert old in text
    return NodeCapture({**h200.outputs, cap.NVIDIA_SMI_XML: text.replace(old, new, 1)})


@pytest.mark.parametrize(
    ("old", "new", "status", "in_observed"),
    [
        (
            "<remapped_row_pending>No</remapped_row_pending>",
            "<remapped_row_pending>Yes</remapped_row_pending>",
            "fail",
            "row remapping pending on GPU 00000000:00:06.0",
        ),
        (
            "<remapped_row_failure>No</remapped_row_failure>",
            "<remapped_row_failure>Yes</remapped_row_failure>",
            "fail",
            "row remapping failed",
        ),
        (
            "<dram_uncorrectable>0</dram_uncorrectable>",
            "<dram_uncorrectable>3</dram_uncorrectable>",
            "warn",
            "3 uncorrectable DRAM errors",
        ),
        (
            "<dram_uncorrectable>0</dram_uncorrectable>",
            "<dram_uncorrectable>N/A</dram_uncorrectable>",
            "pass",
            "1 GPUs",
        ),
        ("<remapped_rows>", "<remapped_rows_gone>", "fail", "not XML"),
        ("<nvidia_smi_log>", '<!DOCTYPE x [<!ENTITY a "aaaa">]><nvidia_smi_log>', "fail", "declares XML entities"),
    ],
)
def test_memory_health_from_the_real_xml_with_one_field_changed(h200, old, new, status, in_observed):
    result = checks.gpu_memory_health(_xml(h200, old, new), expect("p5en.48xlarge"))
    assert result.status == status and in_observed in result.observed
    assert "\n" not in result.observed and (status == "pass" or result.fix)


def test_memory_health_refuses_an_oversized_capture_in_one_line(h200):
    huge = NodeCapture({cap.NVIDIA_SMI_XML: "<nvidia_smi_log>" + " " * parsers.MAX_SMI_XML_CHARS})
    result = checks.gpu_memory_health(huge, expect("p5en.48xlarge"))
    assert result.status == "fail" and "over" in result.observed


def test_memory_health_is_skipped_without_the_capture():
    result = checks.gpu_memory_health(NodeCapture({}), expect("p5en.48xlarge"))
    assert result.status == "skip"
