"""Image Builder component documents rendered from ``images/`` and the version matrix.

The layer documents in ``images/components/`` run scripts from ``/opt/gpucloud/image/scripts``.
Rendering adds a first build step to each that writes its scripts, ``lib.sh`` and ``versions.env``
(the matrix as shell variables) onto the instance, where they stay for the test phase. So a version
lives in ``versions.yaml`` only: documents and scripts name none, and a changed version changes the
rendered documents (and their digests, which name the Image Builder components, so a new version
always means a new component).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpucloud.errors import UserError
from gpucloud.image.matrix import VersionMatrix
from gpucloud.spec.safe_yaml import load_yaml

ON_INSTANCE_DIR = "/opt/gpucloud/image"
MAX_DOCUMENT_CHARS = 16000  # CreateComponent "data" limit (larger documents must come from S3)
PHASES = ("build", "validate", "test")
_SCRIPT_CALL = re.compile(rf"^bash {re.escape(ON_INSTANCE_DIR)}/scripts/(?P<script>[\w.-]+\.sh) (install|validate)$")

# Canonical publishes its AMIs as public SSM parameters; Image Builder accepts "ssm:<name>" as a parent.
_UBUNTU_PARENT = "ssm:/aws/service/canonical/ubuntu/server/{version}/stable/current/amd64/hvm/ebs-gp3/ami-id"


def default_image_dir() -> Path:
    """``images/`` of this checkout (src/gpucloud/image/render.py -> repository root)."""
    return Path(__file__).resolve().parents[3] / "images"


@dataclass(frozen=True)
class RenderedComponent:
    name: str  # the document's name, e.g. "gpucloud-20-nvidia-driver"
    document: str  # YAML text as Image Builder receives it
    parameters: tuple[str, ...]  # parameter names the recipe must give values for

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.document.encode()).hexdigest()[:10]


def render_versions_env(matrix: VersionMatrix) -> str:
    lines = ["# Rendered from images/versions.yaml by gpucloud; do not edit on the instance."]
    lines += [f"{key}={value}" for key, value in sorted(matrix.as_env().items())]
    return "\n".join(lines) + "\n"


def parent_image(matrix: VersionMatrix) -> str:
    return _UBUNTU_PARENT.format(version=matrix.base_os.version)


def wheel_parameters(matrix: VersionMatrix, wheel_s3_uri: str) -> dict[str, str]:
    """Values for the pytorch layer's parameters: where the gpucloud wheel is and what it is called."""
    bucket, _, key = wheel_s3_uri.removeprefix("s3://").partition("/")
    if not wheel_s3_uri.startswith("s3://") or not bucket or not key or key.endswith("/"):
        raise UserError(f"gpucloud wheel URI {wheel_s3_uri!r} must be an s3://bucket/key of a .whl file")
    file_name = wheel_s3_uri.rsplit("/", 1)[-1]
    expected = f"gpucloud-{matrix.versions.gpucloud}-"
    if not (file_name.startswith(expected) and file_name.endswith(".whl")):
        raise UserError(
            f"gpucloud wheel {file_name!r} does not match the matrix pin gpucloud {matrix.versions.gpucloud} "
            f"(expected {expected}*.whl)"
        )
    return {"GpucloudWheelS3Uri": wheel_s3_uri, "GpucloudWheelFile": file_name}


def _write_files_step(matrix: VersionMatrix, scripts_dir: Path, scripts: list[str]) -> dict:
    files = [(f"{ON_INSTANCE_DIR}/versions.env", render_versions_env(matrix), "0644")]
    for name in ["lib.sh", *scripts]:
        files.append((f"{ON_INSTANCE_DIR}/scripts/{name}", (scripts_dir / name).read_text(encoding="utf-8"), "0755"))
    return {
        "name": "WriteGpucloudScripts",
        "action": "CreateFile",
        "inputs": [{"path": p, "content": c, "permissions": m, "overwrite": True} for p, c, m in files],
    }


def load_layer_component(path: Path, scripts_dir: Path) -> dict:
    """Read one layer document and check it has the Image Builder shape and runs scripts that exist."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: cannot read the component document: {err.__class__.__name__}") from None
    document = load_yaml(text, str(path), "component document YAML")
    problem = component_shape_problem(document, {s.name for s in scripts_dir.glob("*.sh")})
    if problem:
        raise UserError(f"{path}: {problem}")
    return document


def render_layer(document: dict, matrix: VersionMatrix, scripts_dir: Path, source: Path) -> RenderedComponent:
    """The layer document with a first build step that writes its scripts and versions.env."""
    scripts = sorted(set(referenced_scripts(document)))
    phases = []
    for phase in document["phases"]:
        steps = list(phase["steps"])
        if phase["name"] == "build":
            steps.insert(0, _write_files_step(matrix, scripts_dir, scripts))
        phases.append({**phase, "steps": steps})
    text = yaml.dump({**document, "phases": phases}, sort_keys=False, width=200, Dumper=_LiteralDumper)
    if len(text) > MAX_DOCUMENT_CHARS:
        raise UserError(
            f"{source}: rendered document is {len(text)} characters; Image Builder accepts at most "
            f"{MAX_DOCUMENT_CHARS} inline (split the layer or shorten its script)"
        )
    parameters = tuple(next(iter(p)) for p in document.get("parameters", []))
    return RenderedComponent(document["name"], text, parameters)


def referenced_scripts(document: dict) -> list[str]:
    found = []
    for phase in document["phases"]:
        for step in phase["steps"]:
            if step["action"] == "ExecuteBash":
                found += [m["script"] for c in step["inputs"]["commands"] if (m := _SCRIPT_CALL.match(c))]
    return found


def component_shape_problem(document: object, scripts: set[str]) -> str | None:
    """The first way ``document`` is not an Image Builder (AWSTOE) component we can run, or None."""
    if not isinstance(document, dict):
        return "a component document must be a YAML mapping"
    for key in ("name", "schemaVersion", "phases"):
        if key not in document:
            return f"missing {key!r}"
    if str(document["schemaVersion"]) != "1.0":
        return f"schemaVersion is {document['schemaVersion']!r}; Image Builder documents use 1.0"
    phases = document["phases"]
    if not isinstance(phases, list) or not phases:
        return "phases must be a non-empty list"
    names = [p.get("name") if isinstance(p, dict) else None for p in phases]
    if any(n not in PHASES for n in names) or len(set(names)) != len(names):
        return f"phases are {names}; allowed once each: {', '.join(PHASES)}"
    for phase in phases:
        steps = phase.get("steps")
        if not isinstance(steps, list) or not steps:
            return f"phase {phase['name']!r} has no steps"
        for step in steps:
            if not isinstance(step, dict) or not step.get("name") or not step.get("action"):
                return f"phase {phase['name']!r}: every step needs a name and an action"
            if step["action"] == "ExecuteBash":
                for command in step.get("inputs", {}).get("commands", []):
                    match = _SCRIPT_CALL.match(command)
                    if match is None:
                        return f"step {step['name']!r}: command {command!r} must be 'bash {ON_INSTANCE_DIR}/scripts/<x>.sh install|validate'"
                    if match["script"] not in scripts:
                        return f"step {step['name']!r}: script {match['script']!r} is not in images/scripts"
    return None


def render_components(matrix: VersionMatrix, image_dir: Path | None = None) -> list[RenderedComponent]:
    """All layer components in recipe order (by file name), rendered for ``matrix``."""
    root = image_dir or default_image_dir()
    scripts_dir, components_dir = root / "scripts", root / "components"
    layers = sorted(components_dir.glob("*.yaml"))
    if not layers:
        raise UserError(f"{components_dir}: no component documents (*.yaml)")
    if not (scripts_dir / "lib.sh").is_file():
        raise UserError(f"{scripts_dir}: lib.sh is missing (every layer script sources it)")
    return [render_layer(load_layer_component(p, scripts_dir), matrix, scripts_dir, p) for p in layers]


class _LiteralDumper(yaml.SafeDumper):
    """Writes multi-line strings (the scripts) as YAML literal blocks, readable in the console."""


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_LiteralDumper.add_representer(str, _str_representer)
