"""The config mechanism: typed sections, unknown/mistyped keys named, overrides."""

import dataclasses
from typing import Literal, Optional

import pytest

from hvdtrack.config import load_config
from hvdtrack.configtools import (
    apply_overrides,
    check,
    from_mapping,
    load_yaml,
    parse_override,
    to_mapping,
)
from hvdtrack.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Inner:
    sizes: tuple[int, ...] = (128, 64)
    mode: Literal["a", "b"] = "a"

    def __post_init__(self):
        check(all(s > 0 for s in self.sizes), "sizes", "must all be > 0")


@dataclasses.dataclass(frozen=True)
class Outer:
    rate: float = 1e-3
    steps: int = 8
    flag: bool = False
    limit: Optional[int] = None
    inner: Inner = dataclasses.field(default_factory=Inner)


def test_defaults_and_values():
    cfg = from_mapping(Outer, {"rate": 1, "inner": {"sizes": [4, 2], "mode": "b"}})
    assert cfg == Outer(rate=1.0, inner=Inner(sizes=(4, 2), mode="b"))
    assert isinstance(cfg.rate, float)
    assert to_mapping(cfg) == {
        "rate": 1.0,
        "steps": 8,
        "flag": False,
        "limit": None,
        "inner": {"sizes": [4, 2], "mode": "b"},
    }


def test_unknown_key_is_named_with_a_suggestion():
    with pytest.raises(
        ConfigError, match=r"f.yaml: unknown key 'inner.mdoe' \(did you mean 'inner.mode'\?\)"
    ):
        from_mapping(Outer, {"inner": {"mdoe": "a"}}, source="f.yaml")


@pytest.mark.parametrize(
    "data, message",
    [
        ({"steps": 2.5}, r"'steps' must be an integer, got float 2.5"),
        ({"steps": True}, r"'steps' must be an integer"),
        ({"rate": "fast"}, r"'rate' must be a number, got str 'fast'"),
        ({"flag": "yes"}, r"'flag' must be true or false"),
        ({"inner": {"mode": "c"}}, r"'inner.mode' must be one of 'a', 'b', got 'c'"),
        ({"inner": {"sizes": 5}}, r"'inner.sizes' must be a list"),
        ({"inner": {"sizes": [4, -1]}}, r"'inner.sizes' must all be > 0"),
        ({"inner": 3}, r"'inner' must be a mapping"),
        ({"limit": "x"}, r"'limit' must be an integer"),
    ],
)
def test_bad_values_are_refused_with_the_key(data, message):
    with pytest.raises(ConfigError, match=message):
        from_mapping(Outer, data, source="f.yaml")


def test_overrides_parse_yaml_values_and_nest():
    assert parse_override("train.lr=1e-3") == (["train", "lr"], 0.001)
    assert parse_override("a.b=[1, 2]") == (["a", "b"], [1, 2])
    assert apply_overrides({"a": {"b": 1}}, ["a.c=true", "d.e=x"]) == {
        "a": {"b": 1, "c": True},
        "d": {"e": "x"},
    }


@pytest.mark.parametrize("text", ["noequals", "=3", "a..b=1"])
def test_malformed_override(text):
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_override(text)


def test_override_into_a_value_is_refused():
    with pytest.raises(ConfigError, match="'a' is a value, not a section"):
        apply_overrides({"a": 1}, ["a.b=2"])


@dataclasses.dataclass(frozen=True)
class Floats:
    rate: float = 1e-3
    cap: Optional[float] = None
    fractions: tuple[float, ...] = (0.5, 0.5)


@pytest.mark.parametrize(
    "text, message",
    [
        ("rate: .inf", r"f.yaml: 'rate' must be a finite number .* got inf"),
        ("rate: -.inf", r"'rate' must be a finite number .* got -inf"),
        ("rate: .nan", r"'rate' must be a finite number .* got nan"),
        ("rate: 1e39", r"'rate' must be a finite number .*float32.* got 1e\+39"),  # inf in float32
        ("rate: 1e400", r"'rate' must be a finite number .* got inf"),  # inf already in YAML
        (f"rate: {10**400}", r"'rate' must be a finite number"),  # an integer too large for float
        ("cap: .inf", r"'cap' must be a finite number"),
        ("fractions: [0.5, .nan]", r"'fractions\[1\]' must be a finite number"),
    ],
)
def test_non_finite_floats_are_refused_with_the_key(text, message):
    with pytest.raises(ConfigError, match=message):
        from_mapping(Floats, load_yaml(text), source="f.yaml")


def test_finite_floats_and_null_pass():
    assert from_mapping(Floats, load_yaml("rate: 3.0e38\ncap: null\nfractions: [-1e-45, 2]")) == (
        Floats(rate=3.0e38, cap=None, fractions=(-1e-45, 2.0))
    )


def test_a_non_finite_setting_in_a_config_file_is_named(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  learning_rate: .inf\n")
    with pytest.raises(ConfigError, match=rf"{path}: 'train.learning_rate' must be a finite"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"=1e39\): 'data.prepare_timeout_s' must be a finite"):
        load_config(path, ["train.learning_rate=0.1", "data.prepare_timeout_s=1e39"])
