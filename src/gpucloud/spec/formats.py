"""What a single text (or sized) setting of a stack file must look like, as annotated types.

Each check sees one value and raises ``ValueError`` with what is allowed; the loader shows the
message as it is written here (``loading.py``). Checks that weigh one setting against another, or
against the catalog, are in ``rules.py``.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Annotated, TypeVar

from pydantic import AfterValidator

DEFAULT_DLAMI_FLAVOUR = "base-oss-nvidia-driver-gpu-ubuntu-22.04"
GROUP_NAME_MAX_CHARS = 20
CLUSTER_NAME_MAX_CHARS = 32
GROUP_NAME_RE = re.compile(rf"[a-z][a-z0-9-]{{0,{GROUP_NAME_MAX_CHARS - 1}}}")
CLUSTER_NAME_RE = re.compile(rf"[a-z][a-z0-9-]{{0,{CLUSTER_NAME_MAX_CHARS - 1}}}")
REGION_RE = re.compile(r"[a-z]{2}(-gov)?-[a-z]+-\d")
RESERVATION_RE = re.compile(r"cr-[0-9a-f]{17}")
AMI_ID_RE = re.compile(r"ami-([0-9a-f]{8}|[0-9a-f]{17})")
FLAVOUR_RE = re.compile(r"[a-z0-9][a-z0-9.-]*")
VPC_ID_RE = re.compile(r"vpc-[0-9a-f]{8,17}")
SUBNET_ID_RE = re.compile(r"subnet-[0-9a-f]{8,17}")
SSM_PARAMETER_RE = re.compile(r"/[A-Za-z0-9_.\-/]+")
SCHEDULE_RE = re.compile(r"(cron|rate)\(.+\)")
ABSOLUTE_PATH_RE = re.compile(r"(/[A-Za-z0-9._-]+)+")
S3_PREFIX_RE = re.compile(r"([A-Za-z0-9._-]+/)+")
IPV4_PREFIX_RE = re.compile(r"\d{1,3}(\.\d{1,3}){3}/\d{1,2}")  # 10.0.0.0/16, not 10.0.0.0/255.255.0.0
CIDR_PREFIX_RE = re.compile(r"[0-9A-Fa-f.:]+/\d{1,3}")  # IPv4 or IPv6 with a prefix length
VPC_PREFIX_RANGE = (16, 24)  # /24 at most: the node subnet, public subnet and spare ranges are carved out of it
FSX_SMALLEST_GIB, FSX_STEP_GIB = 1200, 2400  # PERSISTENT_2 SSD: 1200 GiB, then multiples of 2400
FSX_THROUGHPUTS = (125, 250, 500, 1000)  # PERSISTENT_2 SSD, MB/s per TiB
# an address SNS can deliver to: local@domain.tld, no spaces, one @ (not the full RFC 5322 grammar)
EMAIL_RE = re.compile(
    r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)+"
)
NAME_CHARACTERS = "characters, lower-case letters, digits and '-', starting with a letter"
SSM_PARAMETER_FORM = "an SSM parameter name starting with '/', e.g. '/gpucloud/image/ami-id'"


T = TypeVar("T")


def _check(test: Callable[[T], str | None]) -> AfterValidator:
    """A check of one value: ``test`` returns what is wrong (and what is allowed), or None."""

    def validate(value: T) -> T:
        problem = test(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    return AfterValidator(validate)


def _matching(pattern: re.Pattern[str], allowed: str) -> AfterValidator:
    def test(value: str) -> str | None:
        return None if pattern.fullmatch(value) else allowed

    return _check(test)


def _vpc_cidr(cidr: str) -> str | None:
    try:
        if not IPV4_PREFIX_RE.fullmatch(cidr):  # ipaddress also reads a netmask: 10.0.0.0/255.255.0.0
            raise ValueError(cidr)
        net = ipaddress.IPv4Network(cidr, strict=True)
    except ValueError:
        return "not a valid IPv4 network; expected e.g. 10.0.0.0/16 (a prefix length, host bits zero)"
    low, high = VPC_PREFIX_RANGE
    return None if low <= net.prefixlen <= high else f"prefix length must be /{low} to /{high}"


def prefix_network(cidr: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """``cidr`` as a network when it is one written with a prefix length, else None."""
    if not CIDR_PREFIX_RE.fullmatch(cidr):  # ipaddress also reads netmasks: 0.0.0.0/0.0.0.0 is /0
        return None
    try:
        return ipaddress.ip_network(cidr, strict=True)
    except ValueError:
        return None


def _ssh_cidr(cidr: str) -> str | None:
    net = prefix_network(cidr)
    if net is None:
        return "not a valid CIDR with a prefix length, e.g. 10.1.0.0/16"
    if net.prefixlen == 0:
        return "SSH from the whole internet is not allowed; give your VPN or bastion range"
    return None


def _ssh_cidrs(cidrs: list[str]) -> str | None:
    """0.0.0.0/1 plus 128.0.0.0/1 is 0.0.0.0/0 again: judge what the ranges cover together."""
    nets = [n for n in map(prefix_network, cidrs) if n is not None]
    v4 = [n for n in nets if isinstance(n, ipaddress.IPv4Network)]
    v6 = [n for n in nets if isinstance(n, ipaddress.IPv6Network)]
    merged: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = [*ipaddress.collapse_addresses(v4)]
    merged += ipaddress.collapse_addresses(v6)
    if len(nets) > 1 and any(n.prefixlen == 0 for n in merged):
        return "together these ranges are the whole internet, and SSH from it is not allowed; give your VPN or bastion range"
    return None


def _fsx_size(gib: int) -> str | None:
    if gib == FSX_SMALLEST_GIB or (gib > 0 and gib % FSX_STEP_GIB == 0):
        return None
    return f"FSx for Lustre PERSISTENT_2 size must be {FSX_SMALLEST_GIB} or a multiple of {FSX_STEP_GIB} GiB"


def _fsx_throughput(mbps: int) -> str | None:
    if mbps in FSX_THROUGHPUTS:
        return None
    return f"allowed: {', '.join(map(str, FSX_THROUGHPUTS))} MB/s per TiB (PERSISTENT_2 SSD)"


def _s3_prefix(prefix: str) -> str | None:
    if prefix == "" or S3_PREFIX_RE.fullmatch(prefix):
        return None
    return "a bucket prefix like 'checkpoints/' (ending in '/'), or '' for the whole bucket"


def _link_path(path: str) -> str | None:
    if path == "/":
        return "cannot link the file system root"
    return None if ABSOLUTE_PATH_RE.fullmatch(path) else "an absolute path like /fsx, without spaces"


def _email(example: str) -> AfterValidator:
    return _matching(EMAIL_RE, f"not an email address; expected e.g. '{example}'")


RegionName = Annotated[str, _matching(REGION_RE, "not an AWS region name; expected e.g. 'us-east-1'")]
ClusterName = Annotated[str, _matching(CLUSTER_NAME_RE, f"allowed: 1-{CLUSTER_NAME_MAX_CHARS} {NAME_CHARACTERS}")]
GroupName = Annotated[str, _matching(GROUP_NAME_RE, f"allowed: 1-{GROUP_NAME_MAX_CHARS} {NAME_CHARACTERS}")]
ReservationId = Annotated[
    str, _matching(RESERVATION_RE, "not a capacity reservation id; expected 'cr-' and 17 hex digits")
]
FsxSizeGiB = _check(_fsx_size)  # on an Int field, after the number checks
FsxThroughput = _check(_fsx_throughput)
MountPath = Annotated[str, _matching(ABSOLUTE_PATH_RE, "an absolute path like /fsx, without spaces")]
LinkPath = Annotated[str, _check(_link_path)]
S3Prefix = Annotated[str, _check(_s3_prefix)]
VpcCidr = Annotated[str, _check(_vpc_cidr)]
VpcId = Annotated[str, _matching(VPC_ID_RE, "not a VPC id; expected 'vpc-' and hex digits")]
SubnetId = Annotated[str, _matching(SUBNET_ID_RE, "not a subnet id; expected 'subnet-' and hex digits")]
SshCidr = Annotated[str, _check(_ssh_cidr)]
SshCidrs = Annotated[list[SshCidr], _check(_ssh_cidrs)]
AmiId = Annotated[str, _matching(AMI_ID_RE, "not an AMI id; expected 'ami-' and 8 or 17 hex digits")]
DlamiFlavour = Annotated[
    str, _matching(FLAVOUR_RE, f"a DLAMI flavour as in its SSM parameter, e.g. '{DEFAULT_DLAMI_FLAVOUR}'")
]
SsmParameter = Annotated[str, _matching(SSM_PARAMETER_RE, SSM_PARAMETER_FORM)]
BuildSchedule = Annotated[str, _matching(SCHEDULE_RE, "an Image Builder schedule: 'cron(...)' or 'rate(...)'")]
OncallEmail = Annotated[str, _email("oncall@example.com")]
FinanceEmail = Annotated[str, _email("finance@example.com")]
