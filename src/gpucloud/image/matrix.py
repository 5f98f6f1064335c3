"""The pinned version matrix (``images/versions.yaml``) as a typed model.

Loading validates shape and version syntax only; whether the versions work together is the job of
``rules.py``. Every problem becomes a one-line ``UserError`` naming the file and the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpucloud.errors import UserError
from gpucloud.image.versions import Version, VersionError
from gpucloud.spec.problems import one_line, short_repr
from gpucloud.spec.safe_yaml import load_yaml

DEFAULT_MATRIX_PATH = Path("images") / "versions.yaml"

# The matrix keys, in build order; also the names the scripts see (upper-cased, in versions.env).
VERSION_KEYS: tuple[str, ...] = (
    "nvidia_driver",
    "cuda",
    "cudnn",
    "nccl",
    "efa_installer",
    "aws_ofi_nccl",
    "gdrcopy",
    "dcgm",
    "dcgm_exporter",
    "node_exporter",
    "prometheus",
    "lustre_client",
    "python",
    "pytorch",
    "pytorch_cuda",
    "gpucloud",
)


class BaseOs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Literal["ubuntu"]
    version: Literal["22.04", "24.04"]
    architecture: Literal["x86_64"] = "x86_64"  # P4d/P5 are x86_64 only


class PinnedVersions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    nvidia_driver: str
    cuda: str
    cudnn: str
    nccl: str
    efa_installer: str
    aws_ofi_nccl: str
    gdrcopy: str
    dcgm: str
    dcgm_exporter: str
    node_exporter: str
    prometheus: str
    lustre_client: str
    python: str
    pytorch: str
    pytorch_cuda: str
    gpucloud: str

    @field_validator("*", mode="before")
    @classmethod
    def _is_a_version(cls, value: object) -> str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            # YAML reads 2.15 as a float and would silently turn 2.10 into 2.1.
            raise ValueError(f"write the version in quotes ({value!r} was read as a number)")
        if not isinstance(value, str):
            raise ValueError(f"expected a quoted version string, got {type(value).__name__}")
        try:
            Version.parse(value)
        except VersionError as err:
            raise ValueError(str(err)) from None
        return value

    def parsed(self, key: str) -> Version:
        return Version.parse(getattr(self, key))


class VersionMatrix(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1]
    base_os: BaseOs
    targets: list[str] = Field(min_length=1)
    versions: PinnedVersions

    def v(self, key: str) -> Version:
        return self.versions.parsed(key)

    def as_env(self) -> dict[str, str]:
        """The matrix as the scripts read it: ``GPUCLOUD_<KEY>=<version>`` (plus the base OS)."""
        env = {f"GPUCLOUD_{key.upper()}": getattr(self.versions, key) for key in VERSION_KEYS}
        env["GPUCLOUD_BASE_OS"] = f"{self.base_os.name}-{self.base_os.version}"
        env["GPUCLOUD_ARCH"] = self.base_os.architecture
        return env


def parse_matrix(text: str, source: str) -> VersionMatrix:
    """Parse matrix YAML; ``source`` names the file in error messages."""
    raw = load_yaml(text, source)  # aliases, depth, duplicate keys, odd bytes: one line with the position
    if not isinstance(raw, dict):
        raise UserError(f"{source}: expected a mapping with schema_version, base_os, targets and versions")
    try:
        return VersionMatrix.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise UserError(one_line(f"{source}: {key[:80]}: {_describe(dict(first))}")) from None


def load_matrix(path: Path | str | None = None) -> VersionMatrix:
    """Load the matrix file (``images/versions.yaml`` under the current directory by default)."""
    file = Path(path) if path is not None else DEFAULT_MATRIX_PATH
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{file}: no such version matrix file (pass the path to a versions.yaml)") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as err:
        raise UserError(f"{file}: cannot read the version matrix: {err.__class__.__name__}") from None
    return parse_matrix(text, str(file))


def _describe(error: dict) -> str:
    kind = error["type"]
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        allowed = ", ".join(VERSION_KEYS)
        return f"unknown key (version keys allowed: {allowed})" if "versions" in error["loc"] else "unknown key"
    if kind == "literal_error":
        return f"{short_repr(error['input'])} is not allowed; {error['msg'].replace('Input should be', 'expected')}"
    message = error["msg"]
    return message.removeprefix("Value error, ")
