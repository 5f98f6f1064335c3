"""The pack directory works with `pulumi preview --policy-pack src/gpucloud/policy`."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

import gpucloud.policy

PACK_DIR = Path(gpucloud.policy.__file__).parent
REPO = Path(__file__).resolve().parents[2]


def test_pulumi_policy_yaml_names_python_and_the_project_virtualenv():
    config = yaml.safe_load((PACK_DIR / "PulumiPolicy.yaml").read_text())
    assert config["runtime"]["name"] == "python"
    venv = (PACK_DIR / config["runtime"]["options"]["virtualenv"]).resolve()
    assert venv == (REPO / ".venv").resolve()
    assert config["description"] and config["version"]


def test_main_only_builds_the_pack():
    # PolicyPack(...) starts a gRPC server and blocks, so it must live in __main__.py alone
    tree = ast.parse((PACK_DIR / "__main__.py").read_text())
    calls = [node for node in tree.body if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)]
    assert len(calls) == 1 and calls[0].value.func.id == "PolicyPack"


def test_pack_modules_do_not_shadow_the_standard_library():
    # the policy runtime puts the pack directory first on sys.path
    import sys

    modules = {p.stem for p in PACK_DIR.glob("*.py")} - {"__init__", "__main__"}
    assert not modules & set(sys.stdlib_module_names)
