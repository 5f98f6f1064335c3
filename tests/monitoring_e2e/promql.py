"""The vector selectors of a PromQL expression (metric name and label matchers), read lexically.

Enough PromQL for what our rules and dashboards write: strings, ``{...}`` matchers, ``[range]`` and
``[range:step]``, ``offset``, grouping clauses (``by``/``without``/``on``/``ignoring``/``group_left``/
``group_right`` with their label lists), function calls and keywords. Grafana's template variables
(``$__rate_interval``, ``$instance_id``) are replaced by the caller before querying.
https://prometheus.io/docs/prometheus/latest/querying/basics/
"""

from __future__ import annotations

import dataclasses
import re

_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
        "inf",
        "nan",
        "atan2",
        "start",
        "end",
        # aggregation operators, also written `sum by (x) (...)` (the call's "(" comes later)
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
    }
)
_GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
# A number, or a duration such as 5m or 1h30m (after offset, or in @ and subqueries).
_NUMBER = re.compile(
    r"0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?:(?:ms|s|m|h|d|w|y)(?:\d+(?:ms|s|m|h|d|w|y))*)?"
)
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')


@dataclasses.dataclass(frozen=True)
class Selector:
    name: str  # "" for a selector without a metric name ({job="x"})
    matchers: tuple[tuple[str, str, str], ...]  # (label, op, value)


def selectors(expr: str) -> list[Selector]:
    """Every vector selector in ``expr``, in order."""
    out: list[Selector] = []
    i, n = 0, len(expr)
    while i < n:
        c = expr[i]
        if c in "\"'`":
            i = _skip_string(expr, i)
        elif c == "[":
            i = expr.index("]", i) + 1
        elif c == "{":
            close = _matching_brace(expr, i)
            out.append(Selector("", _matchers(expr[i + 1 : close])))
            i = close + 1
        elif c.isdigit() or (c == "." and i + 1 < n and expr[i + 1].isdigit()):
            m = _NUMBER.match(expr, i)
            i = m.end() if m else i + 1
        elif m := _IDENT.match(expr, i):
            word, i = m.group(0), m.end()
            j = _skip_space(expr, i)
            if word in _GROUPING and j < n and expr[j] == "(":
                i = expr.index(")", j) + 1  # the label list of a grouping clause
            elif word in _KEYWORDS or (j < n and expr[j] == "("):
                pass  # a keyword or a function call
            elif j < n and expr[j] == "{":
                close = _matching_brace(expr, j)
                out.append(Selector(word, _matchers(expr[j + 1 : close])))
                i = close + 1
            else:
                out.append(Selector(word, ()))
        else:
            i += 1
    return out


def metric_names(expr: str) -> set[str]:
    names = {s.name for s in selectors(expr) if s.name}
    for s in selectors(expr):
        names |= {value for label, op, value in s.matchers if label == "__name__" and op == "="}
    return names


def _matchers(body: str) -> tuple[tuple[str, str, str], ...]:
    found, pos = [], 0
    while pos < len(body.strip()):
        m = _MATCHER.match(body, pos)
        if not m:
            raise ValueError(f"cannot read the label matchers {{{body}}}")
        found.append((m.group(1), m.group(2), m.group(3)))
        pos = m.end()
    return tuple(found)


def _skip_space(expr: str, i: int) -> int:
    while i < len(expr) and expr[i].isspace():
        i += 1
    return i


def _skip_string(expr: str, i: int) -> int:
    quote, j = expr[i], i + 1
    while j < len(expr) and expr[j] != quote:
        j += 2 if expr[j] == "\\" and quote != "`" else 1
    return j + 1


def _matching_brace(expr: str, i: int) -> int:
    j = i + 1
    while expr[j] != "}":
        j = _skip_string(expr, j) if expr[j] in "\"'`" else j + 1
    return j
