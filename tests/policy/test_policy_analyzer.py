"""The pack behind the analyzer service `pulumi preview --policy-pack` talks to (minus gRPC transport).

Uses pulumi_policy's private ``_PolicyAnalyzerServicer`` (pinned by pulumi-policy 1.21 in .venv):
properties travel as protobuf ``Struct`` (numbers become floats), stack resources are linked by the
engine's property dependencies (URNs), and preview unknowns must degrade to an advisory note.
"""

from __future__ import annotations

from google.protobuf import struct_pb2
from pulumi.runtime import proto
from pulumi_policy import EnforcementLevel
from pulumi_policy.policy import _PolicyAnalyzerServicer
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE

from gpucloud.policy.pack import PACK_NAME, POLICIES

LT = "aws:ec2/launchTemplate:LaunchTemplate"
SG = "aws:ec2/securityGroup:SecurityGroup"
VPC_IN = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
MANDATORY = 1  # proto EnforcementLevel.MANDATORY
ADVISORY = 0


def servicer() -> _PolicyAnalyzerServicer:
    return _PolicyAnalyzerServicer(PACK_NAME, "0.1.0", POLICIES, EnforcementLevel.ADVISORY)


def struct(props: dict) -> struct_pb2.Struct:
    value = struct_pb2.Struct()
    value.update(props)
    return value


def urn(kind: str, name: str) -> str:
    return f"urn:pulumi:dev::gpucloud::{kind}::{name}"


def launch_template_props(http_tokens: str) -> dict:
    return {
        "metadataOptions": {"httpTokens": http_tokens, "httpPutResponseHopLimit": 2},
        "tags": {"gpucloud:stack": "dev"},
        "networkInterfaces": [
            {"networkCardIndex": 0, "deviceIndex": 0, "interfaceType": "efa", "securityGroups": ["sg-1"]}
        ],
    }


def analyze(kind: str, name: str, props: dict):
    request = proto.AnalyzeRequest(type=kind, properties=struct(props), urn=urn(kind, name), name=name)
    return servicer().Analyze(request, None).diagnostics


def test_compliant_launch_template_has_no_diagnostics():
    assert list(analyze(LT, "lt", launch_template_props("required"))) == []


def test_violation_is_mandatory_and_names_the_policy():
    diagnostics = analyze(LT, "lt", launch_template_props("optional"))
    assert [(d.policyName, d.enforcementLevel) for d in diagnostics] == [("imdsv2-required", MANDATORY)]
    assert "httpTokens is 'optional'" in diagnostics[0].message


def test_preview_unknowns_become_an_advisory_note_not_a_crash():
    diagnostics = analyze(LT, "lt", launch_template_props(UNKNOWN_STRING_VALUE))
    assert [(d.policyName, d.enforcementLevel) for d in diagnostics] == [("imdsv2-required", ADVISORY)]
    assert "during preview" in diagnostics[0].message


def stack_resource(kind: str, name: str, props: dict, deps: dict[str, list[str]] | None = None):
    return proto.AnalyzerResource(
        type=kind,
        urn=urn(kind, name),
        name=name,
        properties=struct(props),
        propertyDependencies={k: proto.AnalyzerPropertyDependencies(urns=v) for k, v in (deps or {}).items()},
    )


def test_stack_policy_follows_engine_property_dependencies():
    group = urn(SG, "efa")
    ingress = stack_resource(
        VPC_IN,
        "in",
        {"ipProtocol": "-1", "securityGroupId": "sg-1", "referencedSecurityGroupId": "sg-1"},
        {"securityGroupId": [group], "referencedSecurityGroupId": [group]},
    )
    template = stack_resource(LT, "lt", launch_template_props("required"), {"networkInterfaces": [group]})
    request = proto.AnalyzeStackRequest(resources=[stack_resource(SG, "efa", {"vpcId": "vpc-1"}), ingress, template])
    diagnostics = servicer().AnalyzeStack(request, None).diagnostics
    assert [(d.policyName, d.urn, d.enforcementLevel) for d in diagnostics] == [
        ("efa-security-group-self-rules", group, MANDATORY)
    ]
    assert "egress rule referencing itself" in diagnostics[0].message
