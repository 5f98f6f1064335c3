"""The ``gpucloud:job-id`` tag on the node's instance, volumes and network interfaces while an
attempt runs, so AWS's cost allocation tags and Cost and Usage Reports can confirm each job's
dollars (docs/cost.md, "Dollars per job").

Each gang member tags its own instance: DescribeInstances on itself for the ids of its attached
EBS volumes and network interfaces (EFA interfaces included), one CreateTags on all of them when
the attempt starts, one DeleteTags when it ends. The node role grants exactly that
(``infra/iam.py``, ``JobTags``): only resources already tagged with this cluster, only this key.

Removed, not set to "", at the end: AWS attributes a resource's usage to the tags it carries while
the usage is metered, never retroactively
(https://docs.aws.amazon.com/awsaccountbilling/latest/aboutv2/cost-alloc-tags.html), so an idle
node's hours fall under "No tagkey: gpucloud:job-id", the same bucket as a node that never ran a job.
An empty value would be a value of its own in Cost Explorer and CUR (``resource_tags_user_gpucloud_job_id
= ''``), one more thing to filter out, and says nothing "no tag" does not. The DeleteTags names the
job's value, so it removes this job's tag only (EC2 DeleteTags deletes a tag only when the value
matches: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DeleteTags.html).

Tagging is non-critical (``agent/noncritical.py``): a failure is logged once and never stops the job.
"""

from __future__ import annotations

import os
from typing import Any

from gpucloud.agent.identity import NodeIdentity
from gpucloud.cluster.agent_contract import JOB_TAG


class JobTagger:
    """Tags this instance and what is attached to it with the running job (``ec2`` injected)."""

    def __init__(self, ec2: Any, instance_id: str) -> None:
        self.ec2, self.instance_id = ec2, instance_id
        self._tagged: tuple[str, list[str]] | None = None  # (job id, resource ids) tagged now

    def resources(self) -> list[str]:
        """The instance, its EBS volumes and its network interfaces (DescribeInstances on itself)."""
        found = [self.instance_id]
        reply = self.ec2.describe_instances(InstanceIds=[self.instance_id])
        for reservation in reply.get("Reservations", []):
            for instance in reservation.get("Instances", []):
                for mapping in instance.get("BlockDeviceMappings", []):
                    volume = mapping.get("Ebs", {}).get("VolumeId")
                    if volume and volume not in found:
                        found.append(volume)
                for interface in instance.get("NetworkInterfaces", []):
                    eni = interface.get("NetworkInterfaceId")
                    if eni and eni not in found:
                        found.append(eni)
        return found

    def tag(self, job_id: str) -> list[str]:
        """Tag every resource of this node with ``job_id``; the ids tagged."""
        resources = self.resources()
        self.ec2.create_tags(Resources=resources, Tags=[{"Key": JOB_TAG, "Value": job_id}])
        self._tagged = (job_id, resources)
        return resources

    def untag(self) -> None:
        """Remove the tag ``tag`` set (this job's value only); nothing when nothing is tagged."""
        if self._tagged is None:
            return
        job_id, resources = self._tagged
        self.ec2.delete_tags(Resources=resources, Tags=[{"Key": JOB_TAG, "Value": job_id}])
        self._tagged = None


def tagger_for(identity: NodeIdentity, hooks: object) -> JobTagger | None:
    """A tagger on a cluster node (an autoscaling group member with AWS hooks and a region), else
    None: off EC2, in the fleet simulation and in tests there is nothing to tag."""
    from gpucloud.agent.asg_hooks import REGION_ENV, AsgHooks

    region = identity.region or os.environ.get(REGION_ENV)
    if not isinstance(hooks, AsgHooks) or identity.instance_id is None or region is None:
        return None
    import boto3

    return JobTagger(boto3.session.Session(region_name=region).client("ec2"), identity.instance_id)
