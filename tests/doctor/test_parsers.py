import pytest

from gpucloud.doctor import parsers

from .conftest import BROKEN, FIXTURES


def read(*parts):
    return FIXTURES.joinpath(*parts).read_text()


def test_gpu_query_csv_from_p4d():
    gpus = parsers.parse_gpu_query(read("p4d-healthy", "nvidia-smi-query.csv"))
    assert len(gpus) == 8
    assert gpus[0] == parsers.Gpu(0, "NVIDIA A100-SXM4-40GB", "580.105.08", 40960, "00000000:10:1C.0")
    assert gpus[7].bus_id == "00000000:A0:1D.0"


def test_banner_driver_and_cuda():
    assert parsers.parse_smi_banner(read("p5-healthy", "nvidia-smi.txt")) == ("580.105.08", "13.0")


def test_fi_info_counts_distinct_devices():
    assert parsers.parse_fi_info_domains(read("p4d-healthy", "fi_info-efa.txt")) == sorted(
        ["rdmap16s27", "rdmap32s27", "rdmap144s27", "rdmap160s27"]
    )
    assert len(parsers.parse_fi_info_domains(read("p5-healthy", "fi_info-efa.txt"))) == 32


def test_fi_info_rdm_and_dgram_of_one_device_count_once():
    text = (
        "provider: efa\n    fabric: efa\n    domain: rdmap16s27-rdm\n    type: FI_EP_RDM\n"
        "provider: efa\n    fabric: efa\n    domain: rdmap16s27-dgrm\n    type: FI_EP_DGRAM\n"
    )
    assert parsers.parse_fi_info_domains(text) == ["rdmap16s27"]


def test_mounts_proc_and_mount_command_forms():
    mounts = parsers.parse_mounts(read("p4d-healthy", "proc-mounts.txt"))
    lustre = [m for m in mounts if m.fstype == "lustre"]
    assert lustre == [
        parsers.Mount("172.31.40.12@tcp:/s3ejzbev", "/fsx", "lustre", "rw,noatime,flock,lazystatfs,encrypt")
    ]
    line = "172.31.40.12@tcp:/s3ejzbev on /fsx type lustre (rw,noatime,flock,lazystatfs)"
    assert parsers.parse_mounts(line)[0].path == "/fsx"
    assert parsers.parse_mounts(r"/dev/md0 /mnt/my\040scratch xfs rw 0 0")[0].path == "/mnt/my scratch"


def test_lsblk_children_show_where_a_disk_is_used():
    devices = parsers.parse_lsblk(read("p4d-healthy", "lsblk.json"))
    stores = [d for d in devices if d.model == "Amazon EC2 NVMe Instance Storage"]
    assert len(stores) == 8 and all(d.mounted_anywhere() == ["/scratch"] for d in stores)


def test_efa_installer_version():
    assert parsers.parse_efa_installed(read("p5-healthy", "efa_installed_packages")) == "1.45.0"


def test_environ_skips_continuation_lines():
    env = parsers.parse_environ("A=1\nMULTI=first\n  second line\nB=x=y\n")
    assert env == {"A": "1", "MULTI": "first", "B": "x=y"}


@pytest.mark.parametrize(
    ("parser", "file", "message"),
    [
        (parsers.parse_gpu_query, "nvidia-smi-driver-gone.txt", "couldn't communicate with the NVIDIA driver"),
        (parsers.parse_gpu_query, "nvidia-smi-query-truncated.csv", "line 2 has 3 fields, expected 5"),
        (parsers.parse_smi_banner, "nvidia-smi-driver-gone.txt", "no 'Driver Version"),
        (parsers.parse_fi_info_domains, "fi_info-no-efa.txt", "fi_info found no EFA provider (fi_getinfo: -61"),
        (parsers.parse_mounts, "proc-mounts-garbage.txt", "mount table line 11"),
        (parsers.parse_lsblk, "lsblk-not-json.txt", "not JSON"),
        (parsers.parse_efa_installed, "efa_installed_packages-no-header", "no '# EFA installer version:' line"),
        (parsers.parse_cuda_version_json, "cuda-version-truncated.json", "no cuda.version"),
        (parsers.parse_imds, "imds-not-json.json", "imds.json is not"),
    ],
)
def test_broken_outputs_raise_one_line_reasons(parser, file, message):
    with pytest.raises(parsers.ParseError) as err:
        parser((BROKEN / file).read_text())
    assert message in str(err.value) and "\n" not in str(err.value)
