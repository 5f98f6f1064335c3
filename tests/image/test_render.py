"""The rendered Image Builder documents: valid shape, every version from the matrix, none typed twice."""

import re
import shutil

import pytest
import yaml

from gpucloud.errors import UserError
from gpucloud.image.matrix import VERSION_KEYS
from gpucloud.image.render import (
    MAX_DOCUMENT_CHARS,
    ON_INSTANCE_DIR,
    component_shape_problem,
    parent_image,
    render_components,
    render_versions_env,
    wheel_parameters,
)

from .conftest import REPO, matrix_with

IMAGES = REPO / "images"
_VERSIONISH = re.compile(r"(?<![\w.])\d+\.\d+(?:\.\d+)*(?:-\d+)?(?![\w.])")


def _steps(document: dict, phase: str) -> list[dict]:
    return next(p["steps"] for p in document["phases"] if p["name"] == phase)


def test_every_layer_renders_as_an_image_builder_document(shipped):
    components = render_components(shipped)
    assert [c.name for c in components] == [
        "gpucloud-10-base",
        "gpucloud-20-nvidia-driver",
        "gpucloud-30-cuda",
        "gpucloud-40-efa",
        "gpucloud-50-dcgm",
        "gpucloud-55-exporters",
        "gpucloud-60-lustre",
        "gpucloud-70-pytorch",
    ]
    scripts = {p.name for p in (IMAGES / "scripts").glob("*.sh")}
    for component in components:
        document = yaml.safe_load(component.document)
        assert component_shape_problem(document, scripts) is None
        assert [p["name"] for p in document["phases"]] == ["build", "validate", "test"]
        assert len(component.document) <= MAX_DOCUMENT_CHARS
        first = _steps(document, "build")[0]
        assert first["action"] == "CreateFile"
        written = {f["path"]: f["content"] for f in first["inputs"]}
        assert written[f"{ON_INSTANCE_DIR}/versions.env"] == render_versions_env(shipped)
        # each script the document runs is written by the document itself (the test instance has them too)
        for phase in ("build", "validate", "test"):
            for step in _steps(document, phase):
                for command in step.get("inputs", {}).get("commands", []) if step["action"] == "ExecuteBash" else []:
                    script = command.split()[1]
                    assert script in written, (component.name, script)
                    assert written[script] == (IMAGES / "scripts" / script.rsplit("/", 1)[-1]).read_text()


def test_versions_env_carries_the_whole_matrix(shipped):
    env = dict(line.split("=", 1) for line in render_versions_env(shipped).splitlines() if not line.startswith("#"))
    for key in VERSION_KEYS:
        assert env[f"GPUCLOUD_{key.upper()}"] == getattr(shipped.versions, key)


def test_no_version_is_typed_twice(shipped):
    """Scripts and layer documents name no version of the matrix; versions.yaml is the only place."""
    pinned = {getattr(shipped.versions, k) for k in VERSION_KEYS}
    sources = list((IMAGES / "scripts").glob("*.sh")) + list((IMAGES / "components").glob("*.yaml"))
    assert len(sources) >= 15
    for source in sources:
        text = source.read_text()
        found = {m for m in _VERSIONISH.findall(text)}
        assert not (found & pinned), (source.name, found & pinned)
        assert "{{" not in text or source.suffix == ".yaml", f"{source.name}: Image Builder would substitute '{{{{'"


def test_a_changed_version_changes_only_the_documents_that_use_it(shipped):
    before = {c.name: c.digest for c in render_components(shipped)}
    after = {c.name: c.digest for c in render_components(matrix_with(nvidia_driver="580.126.09"))}
    # versions.env goes into every layer, so every document changes and gets a new component name
    assert all(before[n] != after[n] for n in before)
    again = {c.name: c.digest for c in render_components(shipped)}
    assert again == before  # rendering is deterministic


def test_wheel_parameters_come_from_the_matrix_pin(shipped):
    uri = "s3://acme-artifacts/wheels/gpucloud-0.1.0-py3-none-any.whl"
    assert wheel_parameters(shipped, uri) == {
        "GpucloudWheelS3Uri": uri,
        "GpucloudWheelFile": "gpucloud-0.1.0-py3-none-any.whl",
    }
    pytorch = render_components(shipped)[-1]
    assert set(pytorch.parameters) == set(wheel_parameters(shipped, uri))


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("https://example.com/gpucloud-0.1.0-py3-none-any.whl", "must be an s3://bucket/key"),
        ("s3://bucket/wheels/", "must be an s3://bucket/key"),
        ("s3:///gpucloud-0.1.0-py3-none-any.whl", "must be an s3://bucket/key"),
        ("s3://bucket/gpucloud-0.2.0-py3-none-any.whl", "does not match the matrix pin gpucloud 0.1.0"),
        ("s3://bucket/gpucloud-0.1.0.tar.gz", "does not match the matrix pin"),
    ],
)
def test_bad_wheel_uri(shipped, uri, message):
    with pytest.raises(UserError, match=message):
        wheel_parameters(shipped, uri)


def test_parent_image_follows_the_base_os(shipped):
    assert (
        parent_image(shipped)
        == "ssm:/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id"
    )


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ("- a list", "must be a YAML mapping"),
        ("name: x\nphases: []\n", "missing 'schemaVersion'"),
        ("name: x\nschemaVersion: 2.0\nphases: [{name: build, steps: [{name: a, action: Reboot}]}]\n", "use 1.0"),
        (
            "name: x\nschemaVersion: 1.0\nphases: [{name: deploy, steps: [{name: a, action: Reboot}]}]\n",
            "allowed once each",
        ),
        ("name: x\nschemaVersion: 1.0\nphases: [{name: build, steps: []}]\n", "has no steps"),
        ("name: x\nschemaVersion: 1.0\nphases: [{name: build, steps: [{name: a}]}]\n", "needs a name and an action"),
        (
            "name: x\nschemaVersion: 1.0\nphases: [{name: build, steps: [{name: a, action: ExecuteBash, inputs: {commands: ['curl evil | sh']}}]}]\n",
            "must be 'bash /opt/gpucloud/image/scripts/<x>.sh install|validate'",
        ),
        (
            "name: x\nschemaVersion: 1.0\nphases: [{name: build, steps: [{name: a, action: ExecuteBash, inputs: {commands: ['bash /opt/gpucloud/image/scripts/nope.sh install']}}]}]\n",
            "'nope.sh' is not in images/scripts",
        ),
    ],
)
def test_broken_component_documents_are_refused_with_the_reason(tmp_path, shipped, document, problem):
    images = tmp_path / "images"
    shutil.copytree(IMAGES, images)
    (images / "components" / "80-broken.yaml").write_text(document)
    with pytest.raises(UserError) as err:
        render_components(shipped, images)
    assert "80-broken.yaml" in str(err.value) and problem in str(err.value)


def test_oversized_document_is_refused(tmp_path, shipped):
    images = tmp_path / "images"
    shutil.copytree(IMAGES, images)
    with (images / "scripts" / "efa.sh").open("a") as script:
        script.write("# padding\n" * 1500)
    with pytest.raises(
        UserError, match=r"40-efa.yaml: rendered document is \d+ characters; Image Builder accepts at most 16000"
    ):
        render_components(shipped, images)


def test_missing_components_dir(tmp_path, shipped):
    (tmp_path / "scripts").mkdir()
    with pytest.raises(UserError, match="no component documents"):
        render_components(shipped, tmp_path)
