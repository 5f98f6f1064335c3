"""Every PromQL expression of the rendered files, ready to hand to Prometheus.

``all_expressions(files)`` reads the output of ``render`` (``{relative path: text}``): the ``expr`` of
every rule in ``rules/*.yml``, every panel target of ``dashboards/*.json`` and the series selector of
every ``label_values(...)`` template variable, as written (Grafana's ``$variables`` kept).
``expressions_in(files)`` gives the same with where each one is and a ``promql`` form in which
Grafana's variables are replaced by values Prometheus accepts (``$__rate_interval`` and friends by
durations, the dashboards' own variables, always used as ``label=~"$var"``, by ``.*``): each can be
checked by ``promtool`` or queried as is. ``check_rules_file`` wraps them as recording rules, so
``promtool check rules`` parses every one.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping

import yaml

from gpucloud.monitoring.yamltext import dump

# Grafana's built-in interval variables, at values that suit a 15 s scrape.
GRAFANA_BUILTINS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
_LABEL_VALUES = re.compile(r"^\s*label_values\((?P<selector>.*),\s*\w+\s*\)\s*$", re.S)


@dataclasses.dataclass(frozen=True, order=True)
class Expression:
    file: str  # the rendered file's relative path
    where: str  # the rule (alert or record name) or "panel title / refId" or "variable name"
    kind: str  # "rule", "panel" or "variable"
    raw: str  # as written in the file
    promql: str  # with Grafana variables substituted


def substitute(expr: str, variables: Mapping[str, str] | None = None) -> str:
    """``expr`` with Grafana variables replaced: built-ins by durations, the rest by ``.*`` (or
    ``variables[name]``)."""
    chosen = {**GRAFANA_BUILTINS, **(variables or {})}

    def value(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g)
        return chosen.get(name, ".*")

    return _VARIABLE.sub(value, expr)


def all_expressions(files: Mapping[str, str]) -> list[str]:
    """Every PromQL expression in ``files`` (``render``'s output, or any ``{path: text}`` of rules
    YAML and dashboard JSON) as written, Grafana's variables kept; each once, in file order."""
    return list(dict.fromkeys(e.raw for e in expressions_in(files)))


def expressions_in(files: Mapping[str, str], variables: Mapping[str, str] | None = None) -> list[Expression]:
    """Every PromQL expression in ``files`` with where it is and its ``promql`` form (Grafana's
    variables replaced: ``variables[name]``, else ``.*``)."""
    found: list[Expression] = []
    for path in sorted(files):
        text = files[path]
        if path.startswith("rules/") and path.endswith((".yml", ".yaml")):
            found += _from_rules(path, text)
        elif path.startswith("dashboards/") and path.endswith(".json"):
            found += _from_dashboard(path, text, variables)
    return found


def _from_rules(path: str, text: str) -> list[Expression]:
    document = yaml.safe_load(text) or {}
    out = []
    for group in document.get("groups", []):
        for rule in group.get("rules", []):
            name = rule.get("alert") or rule.get("record") or "?"
            out.append(Expression(path, name, "rule", rule["expr"], rule["expr"]))
    return out


def _from_dashboard(path: str, text: str, variables: Mapping[str, str] | None) -> list[Expression]:
    document = json.loads(text)
    out = []
    for variable in (document.get("templating") or {}).get("list", []):
        query = variable.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        if variable.get("type") == "query" and isinstance(query, str):
            match = _LABEL_VALUES.match(query)
            if match:
                selector = match.group("selector")
                out.append(Expression(path, variable["name"], "variable", selector, substitute(selector, variables)))
    for panel in _panels(document):
        for target in panel.get("targets") or []:
            if "expr" in target:
                where = f"{panel.get('title', '?')} / {target.get('refId', '?')}"
                out.append(Expression(path, where, "panel", target["expr"], substitute(target["expr"], variables)))
    return out


def _panels(document: dict) -> Iterable[dict]:
    for panel in document.get("panels") or []:
        yield panel
        yield from panel.get("panels") or []  # a collapsed row keeps its panels inside


def check_rules_file(expressions: Iterable[Expression]) -> str:
    """A rules file with one recording rule per expression (``check:e<N>``): ``promtool check rules``
    on it parses every expression, so a syntax error anywhere fails."""
    rules = [{"record": f"check:e{i}", "expr": e.promql} for i, e in enumerate(expressions)]
    return dump({"groups": [{"name": "gpucloud-expression-check", "rules": rules}]})
