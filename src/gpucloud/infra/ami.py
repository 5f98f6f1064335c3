"""Which AMI the nodes boot: a DLAMI through its SSM public parameter, or a fixed AMI id.

Resolving the parameter at deploy time (rather than ``resolve:ssm:`` in the launch template) gives
a reviewable diff and one AMI per deployment instead of whatever is newest at each scale-out.
"""

from __future__ import annotations

import dataclasses

import pulumi
import pulumi_aws as aws

from gpucloud.spec.model import Ami


@dataclasses.dataclass(frozen=True)
class ResolvedImage:
    image_id: pulumi.Output[str]
    root_device_name: pulumi.Output[str]


def resolve_image(ami: Ami, parent: pulumi.Resource | None = None) -> ResolvedImage:
    opts = pulumi.InvokeOutputOptions(parent=parent) if parent is not None else None
    if ami.id is not None:
        image_id = pulumi.Output.from_input(ami.id)
    else:
        # insecure_value: the AMI id is not a secret; `value` would mask it in every diff
        image_id = aws.ssm.get_parameter_output(name=ami.ssm_parameter, opts=opts).insecure_value
    image = aws.ec2.get_ami_output(filters=[aws.ec2.GetAmiFilterArgs(name="image-id", values=[image_id])], opts=opts)
    # The root device differs by OS (/dev/sda1 on Ubuntu, /dev/xvda on Amazon Linux): ask the AMI.
    return ResolvedImage(image_id=image_id, root_device_name=image.root_device_name)
