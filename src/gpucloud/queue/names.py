"""A job named where an id is expected: `gpucloud job show NAME` as well as `job show j-4f2a9c01de`.

An id always wins (ids are unique, names are not). Otherwise the jobs submitted with that ``--name``
are looked up: one is the job; several are an error that lists every match, newest first, so the
user can pick its id; none is the usual ``UnknownJob``, saying names were tried too.
"""

from __future__ import annotations

import time

from gpucloud.errors import UserError
from gpucloud.lifecycle.model import Job
from gpucloud.queue.protocol import JobQueue, UnknownJob

MAX_LISTED = 10  # matches named in the ambiguity error; the rest are counted


class AmbiguousName(UserError):
    def __init__(self, name: str, matches: list[Job]) -> None:
        newest = sorted(matches, key=lambda j: (j.created_at, j.id), reverse=True)
        listed = ", ".join(f"{j.id} ({j.state.value}, submitted {_when(j.created_at)})" for j in newest[:MAX_LISTED])
        more = f" and {len(newest) - MAX_LISTED} more" if len(newest) > MAX_LISTED else ""
        super().__init__(f"{len(matches)} jobs are named {name!r}: {listed}{more}; give the job id instead")
        self.matches = newest


class UnknownJobOrName(UnknownJob):
    def __init__(self, ref: str, queue_uri: str) -> None:
        UserError.__init__(
            self, f"no job {ref!r} in queue {queue_uri}, by id or by name (list them with `gpucloud jobs`)"
        )
        self.job_id = ref


def resolve_job(queue: JobQueue, ref: str) -> Job:
    """The job whose id is ``ref``, else the one job named ``ref`` (``submit --name``)."""
    try:
        return queue.get(ref)
    except UnknownJob:
        pass
    matches = [job for job in queue.list_jobs() if job.spec.name == ref]
    if not matches:
        raise UnknownJobOrName(ref, queue.uri)
    if len(matches) > 1:
        raise AmbiguousName(ref, matches)
    return matches[0]


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(epoch))
