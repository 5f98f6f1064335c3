"""The one YAML reader for user-supplied files (stack files, the image version matrix, component
documents): every failure is one ``UserError`` line with a position, never another exception.

``yaml.safe_load`` alone is not enough for a file a user (or an attacker) hands us:
- aliases share one node many times, so 2 KB of ``&a [*b, *b, ...]`` expands to gigabytes once
  validated, copied or quoted in an error ("billion laughs"): the expanded size is bounded;
- nesting a few hundred levels deep overflows the interpreter's stack (RecursionError): depth is bounded;
- a duplicate key silently keeps the last value (it bypassed a cost ceiling): refused;
- a 5000-digit integer or an impossible timestamp raises ValueError in the constructor: refused
  with the value's position;
- a NUL or other unprintable byte fails in the reader, whose error has no ``problem_mark``: the
  position is computed from the character offset;
- an explicit tag on a value it does not fit (``!!bool maybe``, ``!!timestamp garbage``, ``!!int ''``,
  ``!!set [1]``) raises KeyError, IndexError, AttributeError or TypeError inside PyYAML's
  constructors: refused with the tag, the value and its position;
- a ``"\\ud800"`` escape makes a lone surrogate, a str no encoder writes (Pulumi's fails later):
  refused where it is;
- a text over ``MAX_TEXT_CHARS`` is refused before parsing (20 MB took 8 s to parse).
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from gpucloud.errors import UserError

MAX_DEPTH = 64  # stack files nest 4-5 levels; far below the interpreter's recursion limit
MAX_EXPANDED_NODES = 100_000  # nodes after expanding aliases; a large stack file has a few hundred
MAX_QUOTED_CHARS = 80  # characters of a bad value quoted in an error
MAX_TEXT_CHARS = 1 << 20  # the shipped stack files are a few KB; 1 MiB parses in well under a second


class _Refused(yaml.YAMLError):
    """A document this reader refuses; ``problem_mark`` says where, like PyYAML's own errors."""

    def __init__(self, problem: str, mark: yaml.Mark | None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = mark


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses deep nesting while composing (before recursion can overflow)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(f"nested more than {MAX_DEPTH} levels deep", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, MappingNode):  # e.g. '!!set [1]', '!!map [1]': a tag that wants a mapping
            found = getattr(node, "id", "node")
            raise _Refused(f"{_tag_name(node.tag)} needs a mapping, but found a {found}", node.start_mark)
        seen: dict[Any, Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *defaults' may be overridden: not a duplicate
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # an unhashable key: SafeConstructor reports it below
                continue
            if first is not key_node:
                where = first.start_mark
                raise _Refused(
                    f"duplicate key {_quote(key)} (first at line {where.line + 1}); each key may appear once",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            value = super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as err:  # e.g. a 5000-digit int, a timestamp in year 10000
            if isinstance(err, yaml.YAMLError):
                raise
            value = node.value if isinstance(node, ScalarNode) else node.tag
            raise _Refused(
                f"cannot read the value {_quote(value)} ({_first_line(str(err).split(';')[0])})", node.start_mark
            ) from None
        except (KeyError, IndexError, AttributeError, TypeError):  # an explicit tag that does not fit
            shown = node.value if isinstance(node, ScalarNode) else f"a {getattr(node, 'id', 'node')}"
            raise _Refused(
                f"the value {_quote(shown)} cannot be read as {_tag_name(node.tag)}", node.start_mark
            ) from None
        if isinstance(value, str) and _has_surrogate(value):
            raise _Refused(f"the text {_quote(value)} holds a lone surrogate (not a character)", node.start_mark)
        return value


def _tag_name(tag: str) -> str:
    return "!!" + tag.removeprefix("tag:yaml.org,2002:") if tag.startswith("tag:yaml.org,2002:") else tag


def _has_surrogate(text: str) -> bool:
    return any("\ud800" <= ch <= "\udfff" for ch in text)


def load_yaml(text: str, source: str, what: str = "YAML") -> Any:
    """``text`` parsed as one YAML document; a one-line UserError naming ``source`` and the position otherwise."""
    if len(text) > MAX_TEXT_CHARS:
        raise UserError(
            f"{source}: {len(text)} characters is too large for a {what} file; at most {MAX_TEXT_CHARS} are read"
        )
    loader: _BoundedLoader | None = None
    try:
        loader = _BoundedLoader(text)  # the reader checks every character here
        root = loader.get_single_node()
        if root is None:
            return None
        _check_expansion(root)
        return loader.construct_document(root)
    except yaml.MarkedYAMLError as err:
        raise UserError(f"{source}: not valid {what}{_where(err.problem_mark)}: {_problem(err)}") from None
    except yaml.reader.ReaderError as err:
        mark = _mark_at(text, err.position)
        character = f"#x{err.character:04x}" if isinstance(err.character, int) else repr(err.character)
        raise UserError(f"{source}: not valid {what}{_where(mark)}: unacceptable character {character}") from None
    except _Refused as err:
        raise UserError(f"{source}: not valid {what}{_where(err.problem_mark)}: {err.problem}") from None
    except RecursionError:  # the depth bound makes this unreachable; belt and braces
        raise UserError(f"{source}: not valid {what}: nested too deeply to read") from None
    except yaml.YAMLError as err:
        raise UserError(f"{source}: not valid {what}: {_first_line(str(err))}") from None
    finally:
        if loader is not None:
            loader.dispose()


def _check_expansion(root: Node) -> None:
    """Refuse a node graph whose size with every alias expanded exceeds ``MAX_EXPANDED_NODES``,
    or that contains itself (``&a [*a]``: PyYAML registers an anchor before its children).

    Counted bottom-up with one entry per distinct node, so a bomb is measured without expanding it.
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # entered, children not yet counted
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        children = _children(node)
        if not children_done:
            open_nodes.add(id(node))
            stack.append((node, True))
            for child in children:
                if id(child) in open_nodes:
                    raise _Refused("an alias refers to the value it is part of", child.start_mark)
                if id(child) not in sizes:
                    stack.append((child, False))
            continue
        open_nodes.discard(id(node))
        size = 1 + sum(sizes[id(child)] for child in children)
        if size > MAX_EXPANDED_NODES:
            raise _Refused(
                f"expands to more than {MAX_EXPANDED_NODES} values (aliases repeating aliases); "
                "write the values out instead",
                node.start_mark,
            )
        sizes[id(node)] = size


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _mark_at(text: str, position: int) -> yaml.Mark:
    before = text[:position]
    line = before.count("\n")
    column = position - (before.rfind("\n") + 1)
    return yaml.Mark("<text>", position, line, column, "", 0)


def _where(mark: yaml.Mark | None) -> str:
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def _problem(err: yaml.MarkedYAMLError) -> str:
    parts = [p for p in (err.context, err.problem) if p]
    return _first_line("; ".join(parts) if parts else "invalid YAML")


def _first_line(text: str) -> str:
    return " ".join(text.split())[: MAX_QUOTED_CHARS * 2]


def _quote(value: Any) -> str:
    if isinstance(value, int) and abs(value) > 10**MAX_QUOTED_CHARS:
        text = f"<an integer of about {int(value.bit_length() * 0.30103) + 1} digits>"  # str() may refuse it
    elif isinstance(value, str | int | float | bool) or value is None:
        text = repr(value)
    else:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= MAX_QUOTED_CHARS else text[: MAX_QUOTED_CHARS - 3] + "..."
