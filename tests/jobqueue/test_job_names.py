"""Names work where ids do, on every backend: an id wins, a unique name resolves,
an ambiguous name's error lists every match, an unknown one says ids and names were tried."""

from __future__ import annotations

import pytest

from gpucloud.lifecycle.model import JobSpec
from gpucloud.queue.names import AmbiguousName, resolve_job
from gpucloud.queue.protocol import UnknownJob


def named(name: str | None) -> JobSpec:
    return JobSpec(command=["python", "train.py"], name=name)


def test_a_unique_name_resolves_and_an_id_always_wins(jq):
    llama = jq.submit(named("llama-7b"))
    assert resolve_job(jq, "llama-7b").id == llama.id
    assert resolve_job(jq, llama.id).id == llama.id
    # A job whose *name* is another job's id: the id is the one meant.
    jq.submit(named(llama.id))
    assert resolve_job(jq, llama.id).id == llama.id


def test_an_ambiguous_name_lists_every_match_newest_first(jq):
    first = jq.submit(named("sweep"))
    second = jq.submit(named("sweep"))
    jq.cancel(first.id)
    jq.submit(named("other"))
    with pytest.raises(AmbiguousName) as refused:
        resolve_job(jq, "sweep")
    line = str(refused.value)
    assert "\n" not in line and line.startswith("2 jobs are named 'sweep': ")
    assert line.index(second.id) < line.index(first.id)
    assert f"{first.id} (cancelled, submitted " in line and f"{second.id} (queued, submitted " in line
    assert line.endswith("; give the job id instead")


def test_an_unknown_name_is_unknown_by_id_or_by_name(jq):
    jq.submit(named("llama-7b"))
    with pytest.raises(UnknownJob, match=r"no job 'llama-13b' in queue .*, by id or by name"):
        resolve_job(jq, "llama-13b")
