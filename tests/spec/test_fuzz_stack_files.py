"""Hostile stack files either load or fail as lines naming the file, whatever shape they take.

What `gpucloud plan --stack-file` does before the Pulumi preview (read, parse, validate, plan the
cluster and its cost) runs in process on generated files: mutations of the shipped stacks (values
replaced by hostile ones, text edited byte by byte, alias and nesting constructs) and documents
generated from scratch. The property: ``load_stack_file`` returns a spec whose plan is strict JSON,
or raises ``UserError`` whose every line starts with the file's path and holds no line break or
control character; never another exception. Limits in the reader keep each example small: a bomb
or deep nesting that got past them would show up here as a RecursionError or a run that never ends.
"""

from __future__ import annotations

import copy
import json
import math
import unicodedata
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import fuzz_settings
from gpucloud.errors import UserError
from gpucloud.planning.cluster_plan import plan_cluster
from gpucloud.spec import load_stack_file
from gpucloud.spec.loading import STACKS_DIR

BREAKING = {"Cc", "Cf", "Zl", "Zp"}  # control, format and line/paragraph separators: never raw in a problem
SHIPPED = sorted(STACKS_DIR.glob("Pulumi.*.yaml"))
SHIPPED_TEXT = [p.read_text(encoding="utf-8") for p in SHIPPED]
SHIPPED_CONFIG = [yaml.safe_load(text)["config"] for text in SHIPPED_TEXT]
SPEC_KEYS = [
    "nodeGroups",
    "network",
    "storage",
    "ami",
    "image",
    "agent",
    "access",
    "jobPlane",
    "tags",
    "costCeilingUsdPerHour",
    "clusterName",
    "availabilityZone",
    "availabilityZones",
]

# Values that broke the reader or the rules once, and their relatives.
HOSTILE_SCALARS = st.sampled_from(
    [
        True,
        False,
        None,
        0,
        -1,
        2**63,
        10**400,
        10**20,
        -(10**20),
        float("nan"),
        float("inf"),
        -float("inf"),
        1e308,
        0.5,
        "",
        "dev\n",
        "us-east-1\n",
        "cr-0123456789abcdef0\n",
        "a\r\nb",
        "x\x00y",
        "x" * 1000,
        "10.0.0.0/255.255.0.0",
        "0.0.0.0/1",
        "9999-12-31T23:59:59-23:59",
        "2026-11-25",
        "[" * 3000 + "]" * 3000,
        '{"a": ' + "1" * 5000 + "}",
        '{"k": 1, "k": 2}',
        "{not json",
        "spot",
        "capacity-block",
    ]
)
YAML_VALUES = st.recursive(
    HOSTILE_SCALARS | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path in a config, so a mutation can land anywhere in it."""
    found = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, (*prefix, index))
    return found


def _set(config: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    node: Any = config
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


@st.composite
def mutated_configs(draw: st.DrawFn) -> str:
    """A shipped stack with one to four values replaced, keys added or keys removed."""
    config = copy.deepcopy(draw(st.sampled_from(SHIPPED_CONFIG)))
    for _ in range(draw(st.integers(1, 4))):
        paths = _paths(config)
        action = draw(st.sampled_from(["replace", "add", "remove"]))
        if action == "add" or not paths:
            key = draw(st.sampled_from([f"gpucloud:{k}" for k in SPEC_KEYS] + [":storage", "aws:storage", "x"]))
            config[key] = draw(YAML_VALUES)
        elif action == "replace":
            _set(config, draw(st.sampled_from(paths)), draw(YAML_VALUES))
        else:
            path = draw(st.sampled_from(paths))
            parent: Any = config
            for part in path[:-1]:
                parent = parent[part]
            del parent[path[-1]]
    return yaml.safe_dump({"config": config}, sort_keys=False, allow_unicode=True)


@st.composite
def edited_text(draw: st.DrawFn) -> str:
    """A shipped stack's text with characters inserted, lines repeated or cut: YAML syntax attacks."""
    text = draw(st.sampled_from(SHIPPED_TEXT))
    pieces = st.sampled_from(
        [
            "\x00",
            "\t",
            "&a ",
            "*a",
            "[",
            "{",
            "}",
            ": ",
            "\n",
            "- ",
            "<<: *a\n",
            "!!python/name:os.system",
            "\ufeff",
            "'",
            '"',
        ]
    )
    for _ in range(draw(st.integers(1, 5))):
        at = draw(st.integers(0, len(text)))
        kind = draw(st.sampled_from(["insert", "cut", "repeat-line"]))
        if kind == "insert":
            text = text[:at] + draw(pieces | st.text(max_size=5)) + text[at:]
        elif kind == "cut":
            text = text[:at] + text[at + draw(st.integers(1, 40)) :]
        else:
            lines = text.splitlines(keepends=True)
            index = min(at, len(lines) - 1)
            text = "".join(lines[: index + 1] + lines[index:])
    return text


@st.composite
def alias_and_nesting(draw: st.DrawFn) -> str:
    """Aliases of aliases (fanout x depth) or plain nesting, placed under one key of a real stack."""
    key = draw(st.sampled_from([f"gpucloud:{k}" for k in SPEC_KEYS]))
    fanout, depth = draw(st.integers(1, 12)), draw(st.integers(1, 10))
    head = 'config:\n  aws:region: us-east-1\n  gpucloud:x0: &l0 ["lol"]\n'
    shape = draw(st.sampled_from(["aliases", "nesting", "self-reference"]))
    if shape == "self-reference":
        return head + f"  {key}: &me [1, {{a: " + "[" * depth + "*me" + "]" * depth + "}]\n"
    if shape == "aliases":
        levels = "".join(
            f"  gpucloud:x{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * fanout) + "]\n" for i in range(1, depth)
        )
        return head + levels + f"  {key}: *l{depth - 1}\n"
    nesting = draw(st.integers(1, 2000))
    opener, closer = draw(st.sampled_from([("[", "]"), ("{a: ", "}"), ("- ", "")]))
    if opener == "- ":
        body = "".join(" " * (2 * i + 4) + "- \n" for i in range(min(nesting, 300)))
        return head + f"  {key}:\n" + body
    return head + f"  {key}: " + opener * nesting + "1" + closer * nesting + "\n"


def _check(tmp_path: Path, text: str) -> None:
    path = tmp_path / "Pulumi.fuzz.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        spec = load_stack_file(path)
    except UserError as err:
        lines = str(err).split("\n")
        assert lines and all(line.startswith(f"{path}: ") for line in lines), str(err)[:500]
        assert not any(unicodedata.category(c) in BREAKING for line in lines for c in line), str(err)[:500]
        assert len(lines) <= 21 and all(len(line) < 1200 for line in lines)
        return
    cost = plan_cluster(spec).cost.to_json()  # what `plan -o json` prints about money: strict JSON
    json.dumps(cost, allow_nan=False)
    ceiling = spec.cost_ceiling_usd_per_hour
    assert ceiling is None or math.isfinite(ceiling)


@fuzz_settings(40)
@given(text=mutated_configs())
def test_fuzz_mutated_shipped_stacks(tmp_path_factory, text: str) -> None:
    _check(tmp_path_factory.mktemp("stack"), text)


@fuzz_settings(40)
@given(text=edited_text())
def test_fuzz_edited_stack_text(tmp_path_factory, text: str) -> None:
    _check(tmp_path_factory.mktemp("stack"), text)


@fuzz_settings(30)
@given(text=alias_and_nesting())
def test_fuzz_aliases_and_nesting(tmp_path_factory, text: str) -> None:
    _check(tmp_path_factory.mktemp("stack"), text)


@fuzz_settings(30)
@given(config=st.dictionaries(st.sampled_from([f"gpucloud:{k}" for k in SPEC_KEYS] + ["aws:region"]), YAML_VALUES))
def test_fuzz_generated_documents(tmp_path_factory, config: dict[str, Any]) -> None:
    _check(tmp_path_factory.mktemp("stack"), yaml.safe_dump({"config": config}, allow_unicode=True))
