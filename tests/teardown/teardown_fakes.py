"""For the teardown tests: a fake of the Automation API boundary (``StackHandle``) only, and a
simulated node agent that commits a step once its attempt is asked to stop, through the real queue."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from gpucloud.infra.automation import StackOperationFailed, StackResource
from gpucloud.lifecycle.model import AttemptEnd, AttemptState, Job, JobSpec
from gpucloud.queue.protocol import JobQueue
from helpers.waiting import wait_for

SPEC = JobSpec(command=["python", "train.py"])
STACK = "ci-smoke-42"
BUCKET = StackResource("urn:pulumi:ci::gpucloud::aws:s3/bucketV2:BucketV2::ckpt", "aws:s3/bucketV2:BucketV2", "ckpt-1")
STATE = [
    StackResource(f"urn:pulumi:{STACK}::gpucloud::pulumi:pulumi:Stack::gpucloud-{STACK}", "pulumi:pulumi:Stack"),
    StackResource("urn:pulumi:ci::gpucloud::pulumi:providers:aws::default", "pulumi:providers:aws", "prov-1"),
    StackResource("urn:pulumi:ci::gpucloud::aws:ec2/vpc:Vpc::vpc", "aws:ec2/vpc:Vpc", "vpc-0a1b2c3d"),
    StackResource("urn:pulumi:ci::gpucloud::aws:autoscaling/group:Group::p4d", "aws:autoscaling/group:Group", "p4d"),
    BUCKET,
]


class FakeStack:
    """``StackHandle`` without the pulumi CLI: outputs as given, a destroy that empties the state
    (but for ``left``, and protected resources when asked to exclude them) or fails with ``error``."""

    def __init__(
        self,
        outputs: dict[str, Any] | None = None,
        resources: list[StackResource] | None = None,
        *,
        left: tuple[StackResource, ...] = (),
        error: str | None = None,
        on_destroy: Callable[[], None] | None = None,
        lines: tuple[str, ...] = (),
    ) -> None:
        self.lines = lines  # what the destroy prints first (e.g. the FSx export hook's progress)
        self.name = STACK
        self._outputs = outputs or {}
        self._resources = list(STATE if resources is None else resources)
        self.left, self.error, self.on_destroy = left, error, on_destroy
        self.destroyed_with: list[bool] = []  # exclude_protected of each destroy call

    def outputs(self) -> dict[str, Any]:
        return dict(self._outputs)

    def destroy(self, *, on_output: Callable[[str], None], exclude_protected: bool, run_program: bool) -> None:
        assert run_program  # the FSx export hook runs only under --run-program
        self.destroyed_with.append(exclude_protected)
        for line in self.lines:
            on_output(line)
        if self.on_destroy is not None:
            self.on_destroy()
        for resource in self._resources:
            if not resource.bookkeeping:
                on_output(f" -  {resource.type} {resource.id} deleting")
        if self.error is not None:
            raise StackOperationFailed(f"pulumi destroy ({self.name}): {self.error}")
        self._resources = [
            r for r in self._resources if r.bookkeeping or r in self.left or (exclude_protected and r.protected)
        ]

    def resources(self) -> list[StackResource]:
        return list(self._resources)


def running_job(queue: JobQueue, worker: str = "node-a") -> Job:
    job = queue.submit(SPEC)
    claimed = queue.claim(worker, lease_seconds=600, job_id=job.id)
    assert claimed is not None
    return claimed


class SimulatedAgent(threading.Thread):
    """What a node's supervisor does on a stop request: save step ``step``, end the attempt REQUEUED."""

    def __init__(self, open_queue: Callable[[], JobQueue], job_id: str, attempt: int, *, step: int):
        super().__init__(daemon=True)
        self.open_queue, self.job_id, self.attempt, self.step = open_queue, job_id, attempt, step
        self.error: BaseException | None = None

    def run(self) -> None:
        queue = self.open_queue()  # its own connection, as a node's agent has
        try:
            wait_for(lambda: queue.stop_request(self.job_id, self.attempt), timeout=60, what="the stop request")
            step = self.step
            end = AttemptEnd(
                state=AttemptState.REQUEUED, exit_code=75, last_step=step, committed_step=step, resume_from=step
            )
            queue.end_attempt(self.job_id, self.attempt, end)
        except BaseException as err:  # noqa: BLE001  (reported by the test through .error)
            self.error = err
