"""Job plane: the job queue (with a dead-letter queue), the job table, and the interruption events.

EventBridge delivers four AWS events into an events queue the node agents read in queue mode:
spot interruption warnings, rebalance recommendations (both account-wide: their detail names only
the instance, so consumers match instances to jobs), terminate lifecycle actions of this cluster's
autoscaling groups, and capacity blocks' expiration warnings (account-wide too: the detail names
only the reservation; the consumer lists the reservation's instances). EC2 sends the last one 40
minutes before a block ends, 10 minutes before it starts terminating the block's instances:
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-monitor.html
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import pulumi
import pulumi_aws as aws

from gpucloud.cluster.tags import Tagging
from gpucloud.queue.aws import schema as aws_schema
from gpucloud.signals.eventbridge import CAPACITY_BLOCK_WARNINGS

DLQ_RETENTION_SECONDS = 14 * 24 * 3600  # the SQS maximum: time to inspect poisoned jobs
EVENTS_RETENTION_SECONDS = 3600  # an interruption event older than an hour is useless

SPOT_WARNING = {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]}
REBALANCE = {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]}
# Both names AWS's page gives the event ("Capacity Block Reservation Expiration Warning" and, in one
# version of the example, "Capacity Block Expiration Warning"); the consumer reads both.
CAPACITY_BLOCK_EXPIRY = {"source": ["aws.ec2"], "detail-type": list(CAPACITY_BLOCK_WARNINGS)}


def capacity_block_pattern(reservation_ids: Sequence[str]) -> dict:
    """The expiration warnings of this cluster's capacity blocks only. The event is account-wide:
    unfiltered, another cluster's (or anyone's) block ending would reach this events queue, and the
    handler would stop whatever runs on the instances it lists there."""
    return {**CAPACITY_BLOCK_EXPIRY, "detail": {"capacity-reservation-id": sorted(set(reservation_ids))}}


def lifecycle_pattern(asg_names: Sequence[str]) -> dict:
    return {
        "source": ["aws.autoscaling"],
        "detail-type": ["EC2 Instance-terminate Lifecycle Action"],
        "detail": {"AutoScalingGroupName": list(asg_names)},
    }


JOB_QUEUE_MAX_RECEIVES = 5  # receives before a slot message moves to the dead-letter queue
JOB_QUEUE_VISIBILITY_SECONDS = 900  # until a receiver claims and sets the lease as visibility
JOB_QUEUE_RETENTION_SECONDS = 4 * 24 * 3600
QUEUE_LONG_POLL_SECONDS = 20  # long polling: fewer empty receives


@dataclasses.dataclass
class JobPlaneArgs:
    tagging: Tagging
    max_receive_count: int = JOB_QUEUE_MAX_RECEIVES
    visibility_timeout_seconds: int = JOB_QUEUE_VISIBILITY_SECONDS


class JobPlane(pulumi.ComponentResource):
    job_queue: aws.sqs.Queue
    events_queue: aws.sqs.Queue
    table: aws.dynamodb.Table

    def __init__(self, name: str, args: JobPlaneArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpucloud:jobs:JobPlane", name, None, opts)
        t = args.tagging
        self.job_queue, self.job_dlq = self._queue_pair(
            name, "jobs", t, args.max_receive_count, args.visibility_timeout_seconds, JOB_QUEUE_RETENTION_SECONDS
        )
        self.events_queue, self.events_dlq = self._queue_pair(name, "events", t, 5, 60, EVENTS_RETENTION_SECONDS)
        # Key design (one partition per job: meta, attempts, events; a by-state index for listing)
        # is shared with the queue backend through gpucloud.queue.aws.schema.
        self.table = aws.dynamodb.Table(
            f"{name}-jobs-table",
            billing_mode="PAY_PER_REQUEST",
            hash_key=aws_schema.HASH_KEY,
            range_key=aws_schema.RANGE_KEY,
            attributes=[aws.dynamodb.TableAttributeArgs(name=n, type=t) for n, t in aws_schema.KEY_ATTRIBUTES],
            global_secondary_indexes=[
                aws.dynamodb.TableGlobalSecondaryIndexArgs(
                    name=aws_schema.STATE_INDEX,
                    key_schemas=[
                        aws.dynamodb.TableGlobalSecondaryIndexKeySchemaArgs(
                            attribute_name=aws_schema.STATE_INDEX_HASH_KEY, key_type="HASH"
                        ),
                        aws.dynamodb.TableGlobalSecondaryIndexKeySchemaArgs(
                            attribute_name=aws_schema.STATE_INDEX_RANGE_KEY, key_type="RANGE"
                        ),
                    ],
                    projection_type="ALL",
                )
            ],
            point_in_time_recovery=aws.dynamodb.TablePointInTimeRecoveryArgs(enabled=True),
            server_side_encryption=aws.dynamodb.TableServerSideEncryptionArgs(enabled=True),
            ttl=aws.dynamodb.TableTtlArgs(attribute_name=aws_schema.TTL_ATTRIBUTE, enabled=True),
            tags=t.tags("jobs"),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs(
            {
                "jobQueueUrl": self.job_queue.url,
                "eventsQueueUrl": self.events_queue.url,
                "jobTableName": self.table.name,
            }
        )

    def _queue_pair(
        self, name: str, role: str, t: Tagging, max_receive: int, visibility: int, retention: int
    ) -> tuple[aws.sqs.Queue, aws.sqs.Queue]:
        child = pulumi.ResourceOptions(parent=self)
        dlq = aws.sqs.Queue(
            f"{name}-{role}-dlq",
            message_retention_seconds=DLQ_RETENTION_SECONDS,
            sqs_managed_sse_enabled=True,
            tags=t.tags(f"{role}-dlq"),
            opts=child,
        )
        queue = aws.sqs.Queue(
            f"{name}-{role}",
            visibility_timeout_seconds=visibility,
            message_retention_seconds=retention,
            receive_wait_time_seconds=QUEUE_LONG_POLL_SECONDS,
            sqs_managed_sse_enabled=True,
            redrive_policy=dlq.arn.apply(
                lambda arn: json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": max_receive})
            ),
            tags=t.tags(role),
            opts=child,
        )
        return queue, dlq


@dataclasses.dataclass
class InterruptionEventsArgs:
    tagging: Tagging
    events_queue_arn: pulumi.Input[str]
    events_queue_url: pulumi.Input[str]
    asg_names: Sequence[pulumi.Input[str]]
    block_reservation_ids: Sequence[str] = ()  # the capacity blocks' cr-... ids (none: no expiry rule)


class InterruptionEvents(pulumi.ComponentResource):
    def __init__(self, name: str, args: InterruptionEventsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpucloud:jobs:InterruptionEvents", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        t = args.tagging
        patterns = {
            "spot-warning": pulumi.Output.from_input(json.dumps(SPOT_WARNING)),
            "rebalance": pulumi.Output.from_input(json.dumps(REBALANCE)),
            "asg-terminate": pulumi.Output.all(*args.asg_names).apply(lambda n: json.dumps(lifecycle_pattern(n))),
        }
        if args.block_reservation_ids:
            patterns["capacity-block-expiry"] = pulumi.Output.from_input(
                json.dumps(capacity_block_pattern(args.block_reservation_ids))
            )
        rules = []
        for key, pattern in patterns.items():
            rule = aws.cloudwatch.EventRule(
                f"{name}-{key}",
                description=f"gpucloud {t.cluster}: {key} events to the events queue",
                event_pattern=pattern,
                state="ENABLED",
                tags=t.tags(key),
                opts=child,
            )
            aws.cloudwatch.EventTarget(
                f"{name}-{key}-target",
                rule=rule.name,
                arn=args.events_queue_arn,
                target_id="events-queue",
                retry_policy=aws.cloudwatch.EventTargetRetryPolicyArgs(
                    maximum_event_age_in_seconds=300, maximum_retry_attempts=10
                ),
                opts=child,
            )
            rules.append(rule)
        # EventBridge may only send to the queue on behalf of these rules.
        aws.sqs.QueuePolicy(
            f"{name}-events-policy",
            queue_url=args.events_queue_url,
            policy=pulumi.Output.json_dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Sid": "EventBridgeRules",
                            "Effect": "Allow",
                            "Principal": {"Service": "events.amazonaws.com"},
                            "Action": "sqs:SendMessage",
                            "Resource": args.events_queue_arn,
                            "Condition": {"ArnEquals": {"aws:SourceArn": [r.arn for r in rules]}},
                        }
                    ],
                }
            ),
            opts=child,
        )
        self.rule_arns = [r.arn for r in rules]
        self.register_outputs({"ruleArns": self.rule_arns})
