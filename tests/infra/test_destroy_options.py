"""A destroy that finishes, under Pulumi mocks: the resource options a `pulumi destroy` depends on.

Mocks see inputs; the options (protect, custom timeouts, delete hooks, depends_on) travel in the
registration request, which the preview's monitor records (``RecordedResource.options``).
- node groups delete with force (busy nodes' scale-in protection and the drain hook cannot hold it);
- every launch-template interface, EFA ones included, is deleted with its instance;
- the checkpoint bucket empties on destroy, or with ``protect: true`` is refused by Pulumi;
- the FSx association exports before its delete (a named before_delete hook) and keeps the files;
- security groups and subnets outlast lingering interfaces: deleted after the groups, retried long.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from tests.cli_run import one_line_error, run_cli

from gpucloud.errors import UserError
from gpucloud.infra.compute import GROUP_DELETE_TIMEOUT
from gpucloud.infra.fsx_export import HOOK_NAME
from gpucloud.infra.preview import RecordedResource, StackPreview
from gpucloud.infra.security import ENI_DELETE_TIMEOUT
from gpucloud.spec import load_stack_file, stack_file_for
from gpucloud.spec.model import ClusterSpec

from .stack_outputs import run_with_outputs

ASG = "aws:autoscaling/group:Group"
LT = "aws:ec2/launchTemplate:LaunchTemplate"
BUCKET = "aws:s3/bucket:Bucket"
DRA = "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation"
LUSTRE = "aws:fsx/lustreFileSystem:LustreFileSystem"
SG = "aws:ec2/securityGroup:SecurityGroup"
SUBNET = "aws:ec2/subnet:Subnet"
PROVIDER_DEFAULT_MINUTES = {ASG: 10, SG: 15, SUBNET: 20}  # terraform-provider-aws delete timeouts


def minutes(timeout: str | None) -> float:
    match = re.fullmatch(r"(\d+)([mh])", timeout or "")
    assert match, timeout
    return int(match[1]) * (60 if match[2] == "h" else 1)


def with_storage(spec: ClusterSpec, *, protect: bool | None = None, export_on_destroy: bool | None = None):
    storage = spec.storage
    if protect is not None:
        bucket = storage.checkpoint_bucket.model_copy(update={"protect": protect})
        storage = storage.model_copy(update={"checkpoint_bucket": bucket})
    if export_on_destroy is not None:
        assert storage.fsx is not None
        storage = storage.model_copy(
            update={"fsx": storage.fsx.model_copy(update={"export_on_destroy": export_on_destroy})}
        )
    return spec.model_copy(update={"storage": storage})


def only(resources: list[RecordedResource], type_token: str) -> RecordedResource:
    [found] = [r for r in resources if r.type == type_token]
    return found


@pytest.fixture(scope="module")
def p4d() -> ClusterSpec:
    return load_stack_file(stack_file_for("p4d-spot"))


# --- node groups ---------------------------------------------------------------------------------


def test_every_node_group_deletes_with_force_and_waits_for_its_instances(previews: dict[str, StackPreview]) -> None:
    groups = [r for p in previews.values() for r in p.of_type(ASG)]
    assert len(groups) >= 3
    for group in groups:
        assert group.inputs["forceDelete"] is True, group.name
        assert group.inputs["forceDeleteWarmPool"] is True, group.name
        # long enough for a p5's termination, longer than the provider's 10 minutes
        assert group.options.delete_timeout == GROUP_DELETE_TIMEOUT, group.name
        assert minutes(group.options.delete_timeout) > PROVIDER_DEFAULT_MINUTES[ASG]


def test_every_interface_of_every_launch_template_goes_with_its_instance(previews: dict[str, StackPreview]) -> None:
    templates = [r for p in previews.values() for r in p.of_type(LT)]
    counts = {len(t.inputs["networkInterfaces"]) for t in templates}
    assert max(counts) >= 32  # the p5's 32 EFA interfaces (and its primary) are among them
    for template in templates:
        for nic in template.inputs["networkInterfaces"]:
            assert nic["deleteOnTermination"] == "true", (template.name, nic)


# --- the checkpoint bucket -----------------------------------------------------------------------


@pytest.mark.parametrize("protect", [False, True])
def test_the_bucket_empties_on_destroy_unless_protected(p4d: ClusterSpec, protect: bool) -> None:
    resources, outputs = run_with_outputs(with_storage(p4d, protect=protect), "p4d-spot")
    bucket = only(resources, BUCKET)
    assert bucket.inputs["forceDestroy"] is (not protect)  # empties versions and delete markers first
    assert bucket.options.protect is protect  # pulumi destroy refuses a protected resource
    # the bucket and its settings, nothing else: a destroy with exclude_protected leaves the bucket
    # as it was (versioned, encrypted, private, TLS-only) and deletes the rest of the stack
    [store] = [r for r in resources if r.type == "gpucloud:storage:CheckpointStore"]
    settings = {r.name for r in resources if r.parent == store.urn}
    assert len(settings) == 7 and bucket.name in settings
    assert {r.name for r in resources if r.options.protect} == (settings if protect else set())
    assert outputs["checkpointBucketProtected"] is protect


def test_the_shipped_stacks_leave_the_bucket_unprotected(previews: dict[str, StackPreview]) -> None:
    for preview in previews.values():
        [bucket] = preview.of_type(BUCKET)[:1]
        assert bucket.inputs["forceDestroy"] is True and bucket.options.protect is False


def test_protect_is_read_from_the_stack_file_and_a_bad_value_is_one_line(tmp_path: Path, capsys) -> None:
    config = yaml.safe_load(stack_file_for("dev").read_text())
    config["config"]["gpucloud:storage"]["checkpointBucket"]["protect"] = True
    good = tmp_path / "Pulumi.kept.yaml"
    good.write_text(yaml.safe_dump(config))
    assert load_stack_file(good).storage.checkpoint_bucket.protect is True

    config["config"]["gpucloud:storage"]["checkpointBucket"]["protect"] = "sometimes"
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text(yaml.safe_dump(config))
    with pytest.raises(UserError):
        load_stack_file(bad)
    code, _, err = run_cli(capsys, "plan", "--stack-file", str(bad))
    line = one_line_error(err)
    assert code == 2 and "checkpointBucket.protect" in line and "sometimes" in line


def test_plan_shows_the_protected_bucket(tmp_path: Path, capsys) -> None:
    config = yaml.safe_load(stack_file_for("dev").read_text())
    config["config"]["gpucloud:storage"]["checkpointBucket"]["protect"] = True
    path = tmp_path / "Pulumi.kept.yaml"
    path.write_text(yaml.safe_dump(config))
    code, out, _ = run_cli(capsys, "plan", "--stack-file", str(path), "--output", "json")
    assert code == 0
    protected = [r["name"] for r in json.loads(out)["resources"] if r.get("options", {}).get("protect")]
    assert "kept-checkpoints-bucket" in protected
    assert all(name.startswith("kept-checkpoints-") for name in protected)
    code, out, _ = run_cli(capsys, "plan", "--stack-file", str(path))
    assert code == 0
    [bucket_line] = [line for line in out.splitlines() if "kept-checkpoints-bucket" in line]
    assert bucket_line.rstrip().endswith("protected")
    assert len([line for line in out.splitlines() if line.rstrip().endswith("protected")]) == len(protected)


# --- FSx -----------------------------------------------------------------------------------------


def test_the_association_exports_before_its_delete_and_keeps_the_files(p4d: ClusterSpec) -> None:
    resources, outputs = run_with_outputs(with_storage(p4d, protect=True), "p4d-spot")  # the export's bucket stays
    association = only(resources, DRA)
    assert association.inputs["deleteDataInFilesystem"] is False
    assert association.options.before_delete == (f"p4d-spot-fsx-{HOOK_NAME}",)
    # the only resource with a delete hook: `pulumi destroy` needs --run-program because of it
    assert [r.name for r in resources if r.options.before_delete] == [association.name]
    assert only(resources, LUSTRE).inputs["skipFinalBackup"] is True  # S3-linked: no backups
    assert outputs["fsx"] == {
        "fileSystemId": "fs-0123456789abcdef0",
        "dataRepositoryAssociationId": association.id,
        "fileSystemPath": "/checkpoints",
        "exportPath": "s3://p4d-spot-checkpoints-bucket/checkpoints/",
        "exportOnDestroy": True,
    }


@pytest.mark.parametrize(
    ("protect", "export_on_destroy"),
    [(True, False), (False, None)],
    ids=["explicitly-off", "default-with-a-bucket-the-destroy-deletes"],
)
def test_no_hook_where_the_export_would_not_outlive_the_destroy_or_is_off(
    p4d: ClusterSpec, protect: bool, export_on_destroy: bool | None
) -> None:
    spec = with_storage(p4d, protect=protect)
    if export_on_destroy is not None:
        spec = with_storage(spec, export_on_destroy=export_on_destroy)
    assert spec.storage.fsx is not None and spec.storage.fsx.export_on_destroy is export_on_destroy
    resources, outputs = run_with_outputs(spec, "p4d-spot")
    assert [r.name for r in resources if r.options.before_delete] == []
    assert only(resources, DRA).inputs["deleteDataInFilesystem"] is False
    assert outputs["fsx"]["exportOnDestroy"] is False


def test_an_export_into_a_bucket_the_destroy_deletes_is_refused(tmp_path: Path, capsys) -> None:
    config = yaml.safe_load(stack_file_for("p4d-spot").read_text())
    storage = config["config"]["gpucloud:storage"]
    storage["fsx"]["exportOnDestroy"] = True
    storage.setdefault("checkpointBucket", {})["protect"] = False
    path = tmp_path / "Pulumi.p4d-spot.yaml"
    path.write_text(yaml.safe_dump(config))
    code, _, err = run_cli(capsys, "plan", "--stack-file", str(path))
    line = one_line_error(err)
    assert code == 2 and "storage.fsx.exportOnDestroy" in line and "protect" in line, err
    storage["checkpointBucket"]["protect"] = True  # the bucket outlives the destroy: the export is worth it
    path.write_text(yaml.safe_dump(config))
    code, out, err = run_cli(capsys, "plan", "--stack-file", str(path), "--output", "json")
    assert code == 0, err
    [association] = [r for r in json.loads(out)["resources"] if r["type"] == DRA]
    assert association["options"]["before_delete"] == [f"p4d-spot-fsx-{HOOK_NAME}"]


def test_a_stack_without_fsx_says_so_in_its_outputs(previews: dict[str, StackPreview]) -> None:
    dev = load_stack_file(stack_file_for("dev"))
    assert dev.storage.fsx is None
    resources, outputs = run_with_outputs(dev, "dev")
    assert outputs["fsx"] is None and outputs["checkpointBucketProtected"] is False
    assert not [r for r in resources if r.options.before_delete]


# --- subnets and security groups -----------------------------------------------------------------


def _depends_on(resources: list[RecordedResource]) -> dict[str, set[str]]:
    """Each resource's dependencies as the engine orders deletes: inputs, depends_on, parent."""
    graph: dict[str, set[str]] = {}
    for r in resources:
        found = {urn for urns in r.property_dependencies.values() for urn in urns} | set(r.options.depends_on)
        graph[r.urn] = found
    return graph


def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_groups_are_deleted_before_the_subnets_and_security_groups_their_interfaces_use(
    previews: dict[str, StackPreview],
) -> None:
    """Pulumi deletes a resource before what it depends on: the node group (its launch template)
    depends on the node subnets and the node security group, so their deletes start only once the
    group, and with force delete its instances, are gone."""
    for preview in previews.values():
        graph = _depends_on(preview.resources)
        node_sg = [r.urn for r in preview.of_type(SG) if r.name.endswith("-security-nodes")]
        subnets = [r.urn for r in preview.of_type(SUBNET) if "-network-nodes" in r.name]
        assert node_sg and subnets
        for group in preview.of_type(ASG):
            reached = _reaches(graph, group.urn)
            assert set(node_sg) <= reached, (preview.stack, group.name)
            assert reached & set(subnets), (preview.stack, group.name)
        for fs in preview.of_type(LUSTRE):  # the file system's interfaces: subnet and Lustre group
            reached = _reaches(graph, fs.urn)
            assert any(r.urn in reached for r in preview.of_type(SG) if r.name.endswith("-security-lustre"))


def test_subnets_and_security_groups_wait_out_lingering_interfaces(previews: dict[str, StackPreview]) -> None:
    for preview in previews.values():
        patient = [
            r
            for r in preview.custom_resources
            if (r.type == SUBNET and "-network-nodes" in r.name)
            or (r.type == SG and r.name.endswith(("-security-nodes", "-security-lustre", "-network-endpoints")))
        ]
        assert patient
        for r in patient:
            assert r.options.delete_timeout == ENI_DELETE_TIMEOUT, (preview.stack, r.name)
            assert minutes(r.options.delete_timeout) > PROVIDER_DEFAULT_MINUTES[r.type]
            # longer than the group's own delete: the interfaces go after its instances
            assert minutes(r.options.delete_timeout) > minutes(GROUP_DELETE_TIMEOUT)
