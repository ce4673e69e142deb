"""Typed configuration: YAML mappings validated into frozen dataclasses, with ``a.b=value`` overrides.

Every stage owns the dataclass of its own section (``SyntheticConfig`` beside the generator,
``ModelConfig`` beside the model, ...); ``hvdtrack.config`` composes them. This module holds the
one mechanism that turns a nested mapping into those dataclasses, naming the offending key on error.

Public symbols: ``from_mapping``, ``to_mapping``, ``apply_overrides``, ``parse_override``,
``load_yaml``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from typing import Any, Literal, Mapping, Union

import yaml

from hvdtrack.errors import ConfigError


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads ``1e-3`` as a string; configs are full of such numbers, so resolve them."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


# A config has about a hundred values; aliases could make a few hundred bytes stand for billions.
MAX_YAML_VALUES = 100_000


def load_yaml(text: str, source: str = "config") -> Any:
    """Parses YAML text (safe loader; ``1e-3`` is a float) that is a plain tree of values.

    Refused, before anything is built: a key given twice in one mapping, an alias that refers to
    itself, and a document whose aliases expand to more than ``MAX_YAML_VALUES`` values (an
    "alias bomb"). Every error is one line naming ``source``, and the key and line if any.

    Raises:
      ConfigError: not valid YAML, or one of the above.
    """
    try:
        loader = _Loader(text)  # refuses control characters (a binary file) already
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _check_tree(node, source)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}: not valid YAML: {_one_line(err)}") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply to be a config") from None


def _check_tree(root: yaml.Node, source: str) -> None:
    """Walks the composed nodes (aliases are shared nodes) and refuses duplicate keys, a node
    inside itself, and more than ``MAX_YAML_VALUES`` values once aliases are expanded."""
    sizes: dict[int, int] = {}  # node id -> values it expands to, once walked
    open_nodes: set[int] = set()

    def walk(node: yaml.Node, key: str) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_nodes:
            raise ConfigError(
                f"{source}: '{key or '<top>'}' (line {node.start_mark.line + 1}) refers to "
                "itself through an alias: a config is a tree of values"
            )
        open_nodes.add(id(node))
        size = 1
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, value_node in node.value:
                name, line = key_node.value, key_node.start_mark.line + 1
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE:
                    if (key_node.tag, name) in seen:
                        raise ConfigError(
                            f"{source}: duplicate key '{_join(key, name)}' on line {line} "
                            f"(first on line {seen[key_node.tag, name]})"
                        )
                    seen[key_node.tag, name] = line
                size += walk(key_node, key) + walk(value_node, _join(key, name))
        elif isinstance(node, yaml.SequenceNode):
            size += sum(walk(item, f"{key}[{i}]") for i, item in enumerate(node.value))
        if size > MAX_YAML_VALUES:
            raise ConfigError(
                f"{source}: '{key or '<top>'}' (line {node.start_mark.line + 1}) expands to more "
                f"than {MAX_YAML_VALUES} values through aliases: not a config"
            )
        open_nodes.discard(id(node))
        sizes[id(node)] = size
        return size

    walk(root, "")


_MERGE = "tag:yaml.org,2002:merge"


def _one_line(err: yaml.YAMLError) -> str:
    """A YAML error as one line: what is wrong and where (PyYAML's spans several)."""
    if isinstance(err, yaml.MarkedYAMLError) and err.problem:
        mark = err.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        context = f"{err.context}: " if err.context else ""
        return f"{context}{err.problem}{where}"
    return " ".join(str(err).split())


def from_mapping(cls: type, data: Any, where: str = "", source: str = "config") -> Any:
    """Builds dataclass ``cls`` from a nested mapping, checking every key and type.

    Args:
      cls: a dataclass type whose fields carry type hints (and defaults for optional keys).
      data: the mapping (e.g. from YAML); ``None`` means all defaults.
      where: dotted key prefix used in messages (``"train"``).
      source: file name used in messages.

    Returns:
      An instance of ``cls``.

    Raises:
      ConfigError: on an unknown key (with a close-match suggestion), a missing required key,
        or a value of the wrong type. ``__post_init__`` validation errors are re-raised with the
        key prefix and source.
    """
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source}: '{where or '<top>'}' must be a mapping, got {_describe(data)}"
        )
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    for key in data:
        if key not in fields:
            near = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f" (did you mean '{_join(where, near[0])}'?)" if near else ""
            raise ConfigError(
                f"{source}: unknown key '{_join(where, key)}'{hint}; "
                f"known keys here: {', '.join(sorted(fields))}"
            )
    kwargs = {}
    for name, field in fields.items():
        key = _join(where, name)
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], key, source)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{source}: missing required key '{key}'")
    try:
        return cls(**kwargs)
    except ConfigError as err:
        msg = str(err)
        raise ConfigError(
            msg if msg.startswith(source) else f"{source}: {_prefix(where, msg)}"
        ) from None


def to_mapping(obj: Any) -> Any:
    """Turns a config dataclass (recursively) into plain dicts/lists for YAML or JSON."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_mapping(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_mapping(v) for v in obj]
    return obj


def parse_override(text: str) -> tuple[list[str], Any]:
    """Splits ``"train.learning_rate=1e-3"`` into (["train", "learning_rate"], 0.001).

    The value is parsed as YAML, so ``[1, 2]``, ``true``, ``null`` and numbers work.
    """
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override '{text}' is not of the form section.key=value")
    parsed = load_yaml(value, f"override '{text}'") if value.strip() else ""
    return key.split("."), parsed


def apply_overrides(data: Mapping, overrides: list[str]) -> dict:
    """Returns a copy of nested mapping ``data`` with each ``a.b=value`` override applied."""
    result = _deep_copy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = result
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"override '{text}': '{part}' is a value, not a section")
            node = child
        node[path[-1]] = value
    return result


def check(condition: bool, key: str, message: str) -> None:
    """Raises ``ConfigError`` naming ``key`` unless ``condition``; for ``__post_init__`` checks."""
    if not condition:
        raise ConfigError(f"'{key}' {message}")


# ------------------------------------------------------------------------------------ internals
def _convert(hint: Any, value: Any, key: str, source: str) -> Any:
    """``value`` checked against type ``hint`` (and converted: nested dataclasses, tuples, float);
    ConfigError names ``key`` and ``source``."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return from_mapping(hint, value, key, source)
    if origin in (Union, types.UnionType):
        return _convert_union(args, value, key, source)
    if origin is Literal:
        if value not in args:
            raise ConfigError(
                f"{source}: '{key}' must be one of {', '.join(repr(a) for a in args)}, got {value!r}"
            )
        return value
    if origin in (tuple, list):
        return _convert_sequence(origin, args, value, key, source)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{source}: '{key}' must be a mapping, got {_describe(value)}")
        return dict(value)
    return _convert_plain(hint, value, key, source)


def _convert_union(args: tuple, value: Any, key: str, source: str) -> Any:
    """``value`` as the first of the union's members ``args`` that accepts it."""
    if value is None and type(None) in args:
        return None
    errors = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _convert(arg, value, key, source)
        except ConfigError as err:
            errors.append(str(err))
    if len(errors) == 1:
        raise ConfigError(errors[0])
    wanted = " or ".join(_expected(arg) for arg in args if arg is not type(None))
    raise ConfigError(f"{source}: '{key}' must be {wanted}, got {_describe(value)}")


def _expected(hint: Any) -> str:
    """What a value of type ``hint`` is, for a message: "true or false", "'auto'", "a list"..."""
    if typing.get_origin(hint) is Literal:
        return " or ".join(repr(a) for a in typing.get_args(hint))
    plain = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return plain.get(hint, "a list" if typing.get_origin(hint) in (tuple, list) else "a mapping")


def _convert_sequence(origin: type, args: tuple, value: Any, key: str, source: str) -> Any:
    """``value`` as a tuple or list (``origin``) of items of types ``args``."""
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{source}: '{key}' must be a list, got {_describe(value)}")
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(value) != len(args):
            raise ConfigError(f"{source}: '{key}' must have {len(args)} items, got {len(value)}")
        items = [_convert(a, v, f"{key}[{i}]", source) for i, (a, v) in enumerate(zip(args, value))]
    else:
        item = args[0] if args else Any
        items = [_convert(item, v, f"{key}[{i}]", source) for i, v in enumerate(value)]
    return tuple(items) if origin is tuple else items


def _convert_plain(hint: Any, value: Any, key: str, source: str) -> Any:
    """``value`` checked against a plain type: Any, bool, int, float (made a float) or str."""
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: '{key}' must be true or false, got {_describe(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{source}: '{key}' must be an integer, got {_describe(value)}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{source}: '{key}' must be a number, got {_describe(value)}")
        return _finite(value, key, source)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{source}: '{key}' must be a string, got {_describe(value)}")
        return value
    raise TypeError(f"config field '{key}' has an unsupported type hint {hint!r}")


# Settings end up in float32 tensors, where a larger magnitude (YAML's 1e39) becomes inf.
_FLOAT32_MAX = 3.4028234663852886e38


def _finite(value: int | float, key: str, source: str) -> float:
    """``value`` as a float; ``.inf``, ``.nan`` and magnitudes beyond float32 are refused."""
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not abs(number) <= _FLOAT32_MAX:  # also false for nan
        raise ConfigError(
            f"{source}: '{key}' must be a finite number of at most {_FLOAT32_MAX:.3g} in "
            f"magnitude (it is used in float32), got {value!r}"
        )
    return number


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}" if not isinstance(value, Mapping) else "a mapping"


def _join(where: str, key: Any) -> str:
    return f"{where}.{key}" if where else str(key)


def _prefix(where: str, msg: str) -> str:
    # Turn "'lr' must be > 0" raised by a section into "'train.lr' must be > 0".
    if where and msg.startswith("'"):
        return f"'{where}.{msg[1:]}"
    return msg


def _deep_copy(data: Any) -> Any:
    if isinstance(data, Mapping):
        return {k: _deep_copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deep_copy(v) for v in data]
    return data
