"""``gpucloud submit --group/--fallback-group/--fallback-after``: checked against the cluster's node
groups (node.env's GPUCLOUD_NODE_GROUPS, else the groups the queue's agents registered with); a bad
flag is one line, exit 2, and nothing is queued."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import fuzz_settings
from gpucloud.agent.node_groups import GROUPS_ENV, NodeGroups
from gpucloud.cli import main
from gpucloud.errors import UserError
from gpucloud.lifecycle.model import NodeRecord, NodeState
from gpucloud.queue.sqlite import SqliteQueue


@pytest.fixture
def queue_uri(tmp_path, monkeypatch) -> str:
    monkeypatch.setenv("GPUCLOUD_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(GROUPS_ENV, raising=False)
    monkeypatch.delenv("GPUCLOUD_QUEUE", raising=False)
    return f"sqlite:///{tmp_path / 'queue.db'}"


@dataclasses.dataclass
class Result:
    exit_code: int
    output: str


@pytest.fixture
def submit(monkeypatch, capsys):
    """Run `gpucloud submit` in-process (the real CLI entry point: one-line errors, exit codes)."""

    def run(queue_uri: str, *flags: str, env: dict[str, str] | None = None) -> Result:
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        args = ["submit", "--queue", queue_uri, "--output", "json", *flags, "--", "python", "train.py"]
        capsys.readouterr()
        try:
            main(args)
            code = 0
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
        out = capsys.readouterr()
        return Result(code, out.out + out.err)

    return run


def queued(queue_uri: str) -> list:
    return SqliteQueue(queue_uri.removeprefix("sqlite:///")).list_jobs()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--group", "c"], "--group 'c' is not a node group of this cluster (its groups: a, b)"),
        (["--fallback-group", "zz"], "--fallback-group 'zz' is not a node group of this cluster (its groups: a, b)"),
        (
            ["--group", "b", "--fallback-group", "b"],
            "--fallback-group 'b' is the job's own group; name another group (a)",
        ),
        (
            ["--fallback-group", "a"],
            "--fallback-group 'a' is the job's own group; name another group (b)",
        ),  # a: default
        (["--fallback-group", "b", "--fallback-after", "-1"], "--fallback-after '-1' is not a number of minutes >= 0"),
        (
            ["--fallback-group", "b", "--fallback-after", "nan"],
            "--fallback-after 'nan' is not a number of minutes >= 0",
        ),
        (["--fallback-group", "b", "--fallback-after", "soon"], "--fallback-after 'soon' is not a number of minutes"),
        (["--fallback-after", "5"], "--fallback-after needs --fallback-group"),
    ],
)
def test_bad_group_flags_are_one_line_and_queue_nothing(submit, queue_uri, flags, message) -> None:
    result = submit(queue_uri, *flags, env={GROUPS_ENV: "a,b"})
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.output
    assert queued(queue_uri) == []


def test_group_flags_without_known_groups_say_how_to_name_them(submit, queue_uri) -> None:
    result = submit(queue_uri, "--group", "a")
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1
    assert "node groups are unknown" in result.output and GROUPS_ENV in result.output


def test_the_default_group_and_the_fallback_are_stored_with_the_job(submit, queue_uri) -> None:
    result = submit(queue_uri, "--fallback-group", "b", env={GROUPS_ENV: "a,b"})
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert (shown["group"], shown["fallback_group"]) == ("a", "b")
    (job,) = queued(queue_uri)
    assert (job.spec.group, job.spec.fallback_group, job.spec.fallback_after_minutes) == ("a", "b", None)


def test_groups_the_agents_registered_are_known_without_node_env(submit, queue_uri) -> None:
    queue = SqliteQueue(queue_uri.removeprefix("sqlite:///"))
    queue.register_node(NodeRecord(id="n", address="x", state=NodeState.IDLE, group="gpu", updated_at=time.time()))
    assert submit(queue_uri, "--group", "gpu", "--fallback-after", "0", "--fallback-group", "gpu").exit_code == 2
    result = submit(queue_uri, "--group", "gpu")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["group"] == "gpu"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({GROUPS_ENV: "a,,b"}, "has an empty name"),
        ({GROUPS_ENV: "a,a"}, "names a group twice"),
        ({GROUPS_ENV: "a,B"}, "'B' is not a node group name"),
        ({GROUPS_ENV: "a,b", "GPUCLOUD_NODE_GROUP": "c"}, "GPUCLOUD_NODE_GROUP='c' is not one of"),
    ],
)
def test_bad_node_env_groups_are_named(env, message) -> None:
    with pytest.raises(UserError, match=message):
        NodeGroups.from_env(env)


NAMES = st.sampled_from(["a", "b", "c"])
FLAG_TEXT = st.one_of(
    st.none(),
    st.sampled_from(["0", "10", "-1", "nan", "inf", "1e3", "", " 5", "abc"]),
    st.text(max_size=12),
)


@fuzz_settings(300)
@given(
    group=st.one_of(st.none(), NAMES, st.text(max_size=8)),
    fallback=st.one_of(st.none(), NAMES, st.text(max_size=8)),
    after=FLAG_TEXT,
    queued_for=st.floats(min_value=0, max_value=1e6),
    agent=NAMES,
)
def test_fuzz_group_flags_resolve_or_fail_in_one_line_and_a_job_runs_only_where_allowed(
    group, fallback, after, queued_for, agent
) -> None:
    """Any flag text: a JobSpec that validates, or one UserError line. A resolved job runs on its
    own group always, on its fallback exactly once it has waited, and on no third group."""
    from gpucloud.agent.node_groups import resolve_job_groups
    from gpucloud.lifecycle.model import JobSpec, spec_from_flags

    cluster = NodeGroups(names=("a", "b"))
    try:
        resolved = resolve_job_groups(group, fallback, after, cluster=cluster)
        spec = spec_from_flags(command=["x"], **dataclasses.asdict(resolved))
    except UserError as err:
        assert "\n" not in str(err) and str(err)
        return
    assert isinstance(spec, JobSpec) and spec.group in ("a", "b")
    wait = 60 * (10.0 if spec.fallback_after_minutes is None else spec.fallback_after_minutes)
    runs = NodeGroups(own=agent, names=("a", "b", "c")).takes(spec, queued_for=queued_for)
    if agent == spec.group:
        assert runs
    elif agent == spec.fallback_group:
        assert runs == (queued_for >= wait)
    else:
        assert not runs
