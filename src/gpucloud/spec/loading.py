"""Reading a stack file (``stacks/Pulumi.<stack>.yaml``) into a validated ``ClusterSpec``.

Pulumi stack files keep settings under ``config:`` as ``<namespace>:<key>``. Ours live in the
``gpucloud:`` namespace (unprefixed keys mean the same, as in Pulumi); the region is the AWS
provider's own ``aws:region``. Every problem becomes one line naming the file, the key, the bad
value and what is allowed.
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from gpucloud.catalog import Catalog, load_catalog
from gpucloud.errors import UserError
from gpucloud.payload import parse_json
from gpucloud.regular_files import read_regular
from gpucloud.spec import rules
from gpucloud.spec.model import ClusterSpec
from gpucloud.spec.problems import MAX_PROBLEMS, Problem, key_path, short_repr
from gpucloud.spec.safe_yaml import MAX_TEXT_CHARS, load_yaml

PROJECT = "gpucloud"
STACKS_DIR = Path(__file__).resolve().parents[3] / "stacks"  # the repository's shipped stacks
STACK_FILE_KEYS = {"config", "secretsprovider", "encryptedkey", "encryptionsalt", "environment"}
OTHER_NAMESPACES = {"aws", "pulumi"}  # provider / engine settings we pass through untouched
YAML_KINDS = {list: "a list", str: "text", int: "a number", float: "a number", bool: "true/false"}
TOO_SMALL = {"greater_than", "greater_than_equal"}  # pydantic's error types for a bound not met
TOO_LARGE = {"less_than", "less_than_equal"}


def stack_file_for(name: str, stacks_dir: Path | None = None) -> Path:
    """``stacks/Pulumi.<name>.yaml``; a UserError listing the available stacks otherwise."""
    directory = stacks_dir or default_stacks_dir()
    path = directory / f"Pulumi.{name}.yaml"
    if path.is_file():
        return path
    available = ", ".join(available_stacks(directory)) or "(none)"
    raise UserError(f"no stack named {name!r} (looked for {path}); available stacks: {available}")


def default_stacks_dir() -> Path:
    """``./stacks`` when run inside a Pulumi project that has one, else the shipped stacks."""
    local = Path.cwd() / "stacks"
    return local if (Path.cwd() / "Pulumi.yaml").is_file() and local.is_dir() else STACKS_DIR


def available_stacks(stacks_dir: Path | None = None) -> list[str]:
    directory = stacks_dir or default_stacks_dir()
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in directory.glob("Pulumi.*.yaml"))


def load_stack_file(path: Path | str, catalog: Catalog | None = None) -> ClusterSpec:
    """Parse and validate a stack file; a UserError with one line per problem otherwise."""
    path = Path(path)
    source = str(path)
    try:  # a regular file of bounded size: never a FIFO, a device or 20 MB that takes seconds to parse
        text = read_regular(path, 4 * MAX_TEXT_CHARS).decode("utf-8")
    except FileNotFoundError:
        raise UserError(f"{source}: stack file not found") from None
    except (OSError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else f"{err.__class__.__name__}: {err}"
        raise UserError(f"{source}: cannot read the stack file ({why})") from None
    document = load_yaml(text, source)  # aliases, depth, duplicate keys and odd bytes: one line
    if document is None:
        raise UserError(f"{source}: the stack file is empty; expected a mapping with a 'config:' section")
    if not isinstance(document, dict):
        raise UserError(
            f"{source}: expected a mapping with a 'config:' section, got {_yaml_kind(document)} at the top level"
        )
    unknown = sorted(set(map(str, document)) - STACK_FILE_KEYS)
    if unknown:
        raise UserError(
            f"{source}: unknown top-level key {short_repr(unknown[0])}; allowed: {', '.join(sorted(STACK_FILE_KEYS))}"
        )
    config = document.get("config")
    if not isinstance(config, dict):
        raise UserError(f"{source}: 'config:' must be a mapping of <namespace>:<key> settings")
    return spec_from_config(config, source, catalog)


def spec_from_config(config: Mapping[str, Any], source: str, catalog: Catalog | None = None) -> ClusterSpec:
    """Validate a Pulumi config mapping (stack file or ``pulumi.Config``) into a ``ClusterSpec``.

    String values that hold JSON objects or lists are decoded: the Pulumi engine hands structured
    config to the program as JSON text.
    """
    fields, problems = _split_namespaces(config)
    if problems:
        _fail(source, problems)
    try:
        spec = ClusterSpec.model_validate(fields)
    except ValidationError as err:
        _fail(source, [_problem_from_pydantic(e) for e in err.errors()])
    found = rules.check(spec, catalog or load_catalog())
    if found:
        _fail(source, found)
    return spec


def _split_namespaces(config: Mapping[str, Any]) -> tuple[dict[str, Any], list[Problem]]:
    fields: dict[str, Any] = {}
    problems: list[Problem] = []
    ours = _spec_keys()
    for raw_key, value in config.items():
        key = str(raw_key)
        namespace, colon, name = key.rpartition(":")
        if isinstance(value, dict) and set(value) == {"secure"}:
            problems.append(Problem(key, "secrets are not used by gpucloud stacks; give a plain value"))
            continue
        if key == "aws:region":
            fields["region"] = _decode(key, value, problems)
        elif colon and not namespace:
            problems.append(Problem(key, f"empty namespace; write {PROJECT}:{name}"))
        elif namespace in ("", PROJECT):
            if name == "region":
                problems.append(Problem(key, "unknown key; the region is set with aws:region"))
            elif name in fields:  # 'costCeilingUsdPerHour' and 'gpucloud:costCeilingUsdPerHour': no last-one-wins
                problems.append(Problem(key, f"{name!r} is given twice (with and without '{PROJECT}:'); keep one"))
            else:
                fields[name] = _decode(key, value, problems)
        elif namespace not in OTHER_NAMESPACES:
            problems.append(
                Problem(key, f"unknown namespace {short_repr(namespace)}; allowed: gpucloud:, aws:, pulumi:")
            )
        elif name in ours:  # the provider or engine would silently ignore it: the setting is lost
            problems.append(
                Problem(key, f"a gpucloud setting in the {namespace}: namespace is ignored; write {PROJECT}:{name}")
            )
    if "region" not in fields and not problems:
        problems.append(Problem("aws:region", "required: the AWS region, e.g. us-east-1"))
    return fields, problems


def _spec_keys() -> set[str]:
    return {f.alias or n for n, f in ClusterSpec.model_fields.items()} - {"region"}


def _yaml_kind(value: Any) -> str:
    return YAML_KINDS.get(type(value), type(value).__name__)


class _UnreadableJson(Exception):
    pass


def _decode(key: str, value: Any, problems: list[Problem]) -> Any:
    """Structured config the engine hands over as JSON text, decoded (the only place text is decoded).

    Every key whose value may start with '{' or '[' holds a mapping or a list, so text that looks
    like JSON but does not read as JSON (syntax, deep nesting, huge integers) is reported here.
    """
    if not (isinstance(value, str) and value[:1] in ("{", "[")):
        return value
    try:
        parse_json(value, "the JSON text", _UnreadableJson)  # deep nesting and huge integers fail here
        decoded = json.loads(value, object_pairs_hook=_no_duplicate_keys)  # read before: cannot fail otherwise
        _no_lone_surrogates(decoded)
        return decoded
    except _UnreadableJson as err:
        problems.append(Problem(key, str(err)))
        return None


def _no_lone_surrogates(value: Any) -> None:
    """A ``\\ud800`` escape in JSON text decodes to a lone surrogate, which no encoder writes."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and any("\ud800" <= ch <= "\udfff" for ch in item):
            raise _UnreadableJson(f"the JSON text holds a lone surrogate (not a character) in {short_repr(item)}")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    repeated = next((k for k in keys if keys.count(k) > 1), None)
    if repeated is not None:
        raise _UnreadableJson(f"duplicate key {short_repr(repeated)} in the JSON value; each key may appear once")
    return dict(pairs)


def _fail(source: str, problems: list[Problem]) -> typing.NoReturn:
    shown = [p.render(source) for p in problems[:MAX_PROBLEMS]]
    if len(problems) > MAX_PROBLEMS:
        shown.append(f"{source}: ... and {len(problems) - MAX_PROBLEMS} more problems")
    raise UserError("\n".join(shown))


def _problem_from_pydantic(error: Mapping[str, Any]) -> Problem:
    loc = tuple(error["loc"])
    kind = error["type"]
    value = error.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return Problem(key_path(*loc), f"unknown key{hint}; allowed keys here: {', '.join(allowed)}")
    if kind == "missing":
        return Problem(key_path(*loc), "required key is missing")
    if kind == "literal_error":
        return Problem(key_path(*loc), f"not allowed; allowed: {error['ctx']['expected']}", value)
    in_range = _allowed_range(loc) if kind in TOO_SMALL | TOO_LARGE else None
    if in_range is not None:
        return Problem(key_path(*loc), f"too {'small' if kind in TOO_SMALL else 'large'}; allowed: {in_range}", value)
    message = str(error["msg"])
    if kind == "value_error":  # our own validators' text, written as it is to be shown ('FSx for Lustre ...')
        return Problem(key_path(*loc), message.removeprefix("Value error, "), value)
    return Problem(key_path(*loc), message[:1].lower() + message[1:], value)  # pydantic's 'Input should ...'


def _allowed_range(loc: tuple[Any, ...]) -> str | None:
    """The range of the setting at ``loc`` as its field declares it (``Field(ge=..., le=...)``) and its
    unit (the field's description): '1 to 5000 nodes', 'more than 0 and at most 8760 (hours)'."""
    field = _field_at(loc)
    if field is None:
        return None
    if isinstance(loc[-1], int):  # an item of a list: its bounds are on the item type
        item = next(iter(typing.get_args(field.annotation)), None)
        field = next((m for m in typing.get_args(item)[1:] if isinstance(m, FieldInfo)), None)
        if field is None:
            return None
    bounds = {k: getattr(c, k) for c in field.metadata for k in ("ge", "gt", "le", "lt") if hasattr(c, k)}
    if not bounds:
        return None
    if "ge" in bounds and "le" in bounds:
        text = f"{bounds['ge']} to {bounds['le']}"
    else:
        words = {"ge": "at least", "gt": "more than", "le": "at most", "lt": "less than"}
        text = " and ".join(f"{words[k]} {bounds[k]}" for k in words if k in bounds)
    return f"{text} {field.description}" if field.description else text


def _field_at(loc: tuple[Any, ...]) -> FieldInfo | None:
    """The field of the setting at ``loc`` (list indexes skipped: an item's field is its list's)."""
    model: type[BaseModel] | None = ClusterSpec
    field = None
    for part in loc:
        if isinstance(part, int):
            continue
        if model is None:
            return None
        field = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        if field is None:
            return None
        model = _model_in(field.annotation)
    return field


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys the model accepts at ``loc`` (for 'did you mean' style errors)."""
    model: type[BaseModel] | None = ClusterSpec
    if any(not isinstance(part, int) for part in loc):
        field = _field_at(loc)
        model = _model_in(field.annotation) if field else None
    if model is None:
        return []
    names = [f.alias or n for n, f in model.model_fields.items()]
    if model is ClusterSpec:
        names = [n for n in names if n != "region"]
    return sorted(names)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None
