"""Checks for config values and for the records of every other file xattn reads: each field's type,
then its range or choices, then the rules that tie fields together (those live in each dataclass's
__post_init__). A failed check is a ConfigError that names `section.key`, which the CLI prints as one
line. Also the conversion of YAML, command-line and table values to each field's type (`build`), and
`read_record`, which builds a record of a file (analysis.yaml, a head mask, a row of an importance
table) by the same rules and names the file, and line where there is one, in its errors.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import types
import typing
from typing import Any, Callable

import yaml

from xattn.errors import XattnError


class ConfigError(XattnError):
    """A config value of the wrong type or out of range; `key` is "section.name"."""

    def __init__(self, key: str, problem: str):
        super().__init__(f"{key}: {problem}")
        self.key, self.problem = key, problem

    def __reduce__(self):  # picklable across processes, like any XattnError (distributed.Context.first)
        return type(self), (self.key, self.problem)


class Unused(ConfigError):
    """A setting the kind of search chosen would ignore (DecodeConfig.refuse_unused)."""


class UnknownKey(ConfigError):
    """A key the dataclass being built does not have: "unknown config key section.name (did you mean ...)"."""

    def __init__(self, key: str, message: str):
        XattnError.__init__(self, message)
        self.key, self.problem = key, message


Check = Callable[[Any], "str | None"]  # value -> what is wrong with it, or None


def within(lo: float | None = None, hi: float | None = None, lo_open: bool = False, hi_open: bool = False) -> Check:
    """A finite number in the interval from `lo` to `hi` (open or closed at each end; None: unbounded)."""
    if hi is None:
        want = f"{'>' if lo_open else '>='} {bound(lo)}"
    else:
        want = f"in {'(' if lo_open else '['}{bound(lo)}, {bound(hi)}{')' if hi_open else ']'}"

    def check(value: float) -> str | None:  # an int of any size is compared exactly (as a float it may overflow)
        if not isinstance(value, int) and not math.isfinite(value):  # (inf is >= 0: say why it is refused)
            return f"must be a finite number {want}, got {value!r}"
        ok = (lo is None or (value > lo if lo_open else value >= lo)) and \
            (hi is None or (value < hi if hi_open else value <= hi))
        return None if ok else f"must be {want}, got {value!r}"
    return check


def bound(x: float) -> str:
    """A bound as a message shows it: an int whole (2**63 - 1, not 9.22337e+18), a float short."""
    return str(x) if isinstance(x, int) else f"{x:g}"


def one_of(*choices: str) -> Check:
    return lambda value: None if value in choices else f"{value!r} is not one of {', '.join(choices)}"


def head_problem(heads: typing.Sequence[int], layer: int, chosen: typing.Sequence[int] | None,
                 what: str = "attention") -> str | None:
    """What is wrong with reading heads `chosen` (None: all) of layer `layer` of an attention with `heads` heads per
    layer (None: nothing): a layer or head the model lacks, one whose heads were all pruned, or a head given twice.
    Every choice of a
    layer and heads (analysis.maps.HeadChoice, decoding.Tracked) is checked here."""
    if not any(heads):
        return f"this model has no {what} heads left (all pruned): there is no attention to read"
    if not 0 <= layer < len(heads):
        return f"layer {layer} is not a layer of this model (0 to {len(heads) - 1})"
    if (n := heads[layer]) == 0:
        left = ", ".join(str(i) for i, k in enumerate(heads) if k)
        return f"layer {layer} has no {what} heads left (pruned); layers with heads: {left}"
    if bad := [h for h in chosen or () if not 0 <= h < n]:
        return f"layer {layer} has no head {bad[0]} (its {what} heads: 0 to {n - 1})"
    if (twice := next((h for i, h in enumerate(chosen or ()) if h in chosen[:i]), None)) is not None:
        return f"head {twice} of layer {layer} is given twice; give distinct heads"
    return None


def device_name(value: str) -> str | None:
    if re.fullmatch(r"auto|cpu(:0)?|cuda(:\d+)?|mps(:0)?", value):  # (cpu:0 and mps:0, as torch writes them)
        return None
    return f"{value!r} is not a device: use auto, cpu, cuda, cuda:N or mps"


def sha256_hex(value: str) -> str | None:
    if len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return None
    return f"expected 64 lowercase hex digits (a SHA-256), got {value!r}"


def finite(value: float) -> str | None:
    return None if math.isfinite(value) else f"must be a finite number, got {value!r}"


POSITIVE, NON_NEGATIVE, FRACTION = within(1), within(0), within(0, 1, hi_open=True)


def validate(config: Any, section: str) -> None:
    """Check each field's type and its entry in the class's CHECKS table (applied to each item of a tuple or
    list, nested lists included, None items left out); raise ConfigError on the first miss, naming the item of a
    list or tuple by its place (`cross[0][2]: expected float`, where `cross:` left the layer and head to find)."""
    for name, hint in hints(type(config)).items():
        key, value = _key(section, name), getattr(config, name)
        found = _type_problem(value, hint)
        if found is None and value is not None and name in config.CHECKS:
            found = next(((at, p) for at, item in _items(value) if (p := config.CHECKS[name](item))), None)
        if found:
            raise ConfigError(key + found[0], found[1])


def _key(section: str, name: str) -> str:
    return f"{section}.{name}" if section else name


def _items(value: Any, at: str = "") -> list[tuple[str, Any]]:
    """The items a CHECKS entry sees, each with its place (`[0][2]`): a tuple's or (nested) list's items, else the
    value itself."""
    if not isinstance(value, (tuple, list)):
        return [(at, value)]
    return [pair for i, v in enumerate(value) if v is not None for pair in _items(v, f"{at}[{i}]")]


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _type_problem(value: Any, hint: Any, at: str = "") -> tuple[str, str] | None:
    """(The place of the item of `value` that is not of type `hint`, `[0][2]` or "" for the value itself, what is
    wrong with it), or None."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return None
        arms = [a for a in typing.get_args(hint) if a is not type(None)]
        problems = [_type_problem(value, a, at) for a in arms]
        if all(problems):
            return problems[0] if len(arms) == 1 else (at, f"expected {type_name(hint)}, got {value!r}")
        return None
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, tuple) or len(value) != len(args):
            return at, f"expected {len(args)} values, got {value!r}"
        return next((p for i, (v, a) in enumerate(zip(value, args)) if (p := _type_problem(v, a, f"{at}[{i}]"))),
                    None)
    if origin is list or hint is list:
        if not isinstance(value, list):
            return at, f"expected {type_name(hint)}, got {value!r}"
        item = (typing.get_args(hint) or (None,))[0]
        return None if item is None else next((p for i, v in enumerate(value)
                                               if (p := _type_problem(v, item, f"{at}[{i}]"))), None)
    kinds = {float: (int, float), int: (int,), bool: (bool,), str: (str,), dict: (dict,)}[origin or hint]
    if not isinstance(value, kinds) or (hint is not bool and isinstance(value, bool)):
        return at, f"expected {type_name(hint)}, got {value!r}"
    return None


def type_name(hint: Any) -> str:
    """`int`, `list of float`, `list of int or str`, ...: a field's type as an error message says it."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in args if a is not type(None))
    if origin is list:
        return f"a list of {type_name(args[0])}"
    return getattr(origin or hint, "__name__", str(hint))


# ------------------------------------------------------------------ values from YAML and overrides

def nearest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else f" (valid: {', '.join(valid)})"


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Convert a YAML or command-line value to the field's declared type (ranges are checked by `validate`)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        arms = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(arms) < len(typing.get_args(hint)) and (value is None or (isinstance(value, str) and
                                                                        value.lower() in ("null", "none"))):
            return None
        problems = []
        for arm in arms:  # the first type the value converts to
            try:
                return _coerce(value, arm, where)
            except ConfigError as e:
                problems.append(e)
        if len(arms) == 1:  # (its own error: the item it names, `cross[0][2]`)
            raise problems[0]
        raise ConfigError(where, f"expected {type_name(hint)}, got {value!r}")
    if value is None:
        raise ConfigError(where, f"expected {type_name(hint)}, got null")
    if origin is list or hint is list:
        if hint is list and isinstance(value, str):  # an override written as YAML: data.corpora=[{tsv: a.tsv}]
            value = _yaml_value(value, where)
        if not isinstance(value, list):
            raise ConfigError(where, f"expected {type_name(hint)}, got {value!r}")
        item = (typing.get_args(hint) or (None,))[0]
        return list(value) if item is None else [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if hint is dict or origin is dict:  # from YAML, or an override written as YAML: model.heads={cross: [8, 1, 8]}
        value = _yaml_value(value, where) if isinstance(value, str) else value
        if not isinstance(value, dict):
            example = {"model.heads": "{cross: [8, 4, 1]}"}.get(where, "{cross: gaussian}")
            raise ConfigError(where, f"expected a mapping such as {example}, got {value!r}")
        return value
    if origin is tuple:
        items = value if isinstance(value, (list, tuple)) else str(value).strip("()[]").split(",")
        args = typing.get_args(hint)
        if len(items) != len(args):
            raise ConfigError(where, f"expected {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, where) for v, a in zip(items, args))
    if hint is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("true", "yes", "1"):
            return True
        if str(value).lower() in ("false", "no", "0"):
            return False
        raise ConfigError(where, f"expected true or false, got {value!r}")
    if isinstance(value, (bool, list, dict)) or (hint is str and not isinstance(value, (str, int, float))):
        raise ConfigError(where, f"expected {hint.__name__}, got {value!r}")
    try:
        if hint is int and isinstance(value, str) and "e" in value.lower():
            number = float(value)
            if not number.is_integer():
                raise ValueError
            return int(number)
        if hint is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        return hint(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(where, f"expected {hint.__name__}, got {value!r}") from None


def _yaml_value(text: str, where: str) -> Any:
    from xattn.yamlfile import unique_key_loader, yaml_problem

    try:
        return yaml.load(text, Loader=unique_key_loader())
    except yaml.YAMLError as e:
        raise ConfigError(where, f"not valid YAML ({yaml_problem(e)})") from None


def build(cls: type, values: dict[str, Any], section: str, base: Any = None, what: str = "config key") -> Any:
    """Build dataclass `cls` from `values`, on top of `base` (an instance) if given; `what` the values are
    ("config key") names an unknown one."""
    fields = hints(cls)
    kwargs = dataclasses.asdict(base) if base is not None else {}
    for key, value in values.items():
        if key not in fields:
            raise UnknownKey(_key(section, str(key)), f"unknown {what} {_key(section, str(key))}"
                             f"{nearest(str(key), list(fields))}")
        kwargs[key] = _coerce(value, fields[key], _key(section, key))
    return cls(**kwargs)


def read_record(cls: type, values: Any, where: str, section: str = "") -> Any:
    """Dataclass `cls` (typed fields, a CHECKS table, rules in __post_init__) from `values` read from a file:
    a mapping (a YAML section, a table row by its header). Not a mapping, a key missing, unknown or given
    twice (read_yaml refuses those), a value of the wrong type or out of range: one XattnError
    `where: key: problem`, `where` naming the file and, where there is one, the line."""
    if not isinstance(values, dict):
        keys = ", ".join(f.name for f in dataclasses.fields(cls))
        raise XattnError(f"{where}: {f'{section}: ' if section else ''}expected a mapping with the keys {keys}, "
                         f"got {values!r}")
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing := [name for name in required if name not in values]:
        raise XattnError(f"{where}: {_key(section, missing[0])}: missing")
    try:
        record = build(cls, values, section, what="key")
        validate(record, section)
    except XattnError as e:
        raise XattnError(f"{where}: {e}") from None
    return record
