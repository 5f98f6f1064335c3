"""YAML text for the rendered files: keys in the order written, multi-line strings (PromQL, templates)
as literal blocks so a reader sees the expression as it was written."""

from __future__ import annotations

from typing import Any

import yaml


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "\n" in value:
        # a literal block cannot keep trailing spaces; strip them so the block style is always possible
        value = "\n".join(line.rstrip() for line in value.splitlines())
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_Dumper.add_representer(str, _str)


def dump(data: Any, header: str = "") -> str:
    """``data`` as YAML, after ``header`` turned into ``#`` comment lines."""
    comment = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines()) if header else ""
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True, default_flow_style=False)
    return comment + body
