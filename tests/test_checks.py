"""xattn.checks.read_record: the records of files xattn reads, checked by the rules of config values."""
from dataclasses import dataclass
from typing import ClassVar

import pytest

from xattn.checks import NON_NEGATIVE, ConfigError, read_record, validate, within
from xattn.errors import XattnError


@dataclass(frozen=True)
class Record:
    count: int
    heads: list[int] | str = "mean"
    factors: list[list[float] | None] | None = None
    note: str | None = None

    CHECKS: ClassVar[dict] = dict(count=NON_NEGATIVE, heads=lambda h: None if h == "mean" or isinstance(h, int) else
                                  f"expected 'mean' or head numbers, got {h!r}", factors=within(0, 1))

    def __post_init__(self):
        validate(self, "part")


def test_a_record_is_built_from_typed_values():
    record = read_record(Record, {"count": 3, "heads": [0, 2], "factors": [[0.5, 1], None]}, "f.yaml", "part")
    assert record == Record(3, [0, 2], [[0.5, 1.0], None])
    assert read_record(Record, {"count": "4", "heads": "mean"}, "f.yaml", "part").count == 4  # as in a config


@pytest.mark.parametrize("values, message", [
    ({"count": 1.5}, "f.yaml: line 3: part.count: expected int, got 1.5"),
    ({"count": True}, "part.count: expected int, got True"),
    ({"count": -1}, "part.count: must be >= 0, got -1"),
    ({"count": 1, "heads": [0, "x"]}, "part.heads: expected a list of int or str, got [0, 'x']"),
    ({"count": 1, "heads": "all"}, "part.heads: expected 'mean' or head numbers, got 'all'"),
    ({"count": 1, "factors": [[0.5, 2]]}, "part.factors[0][1]: must be in [0, 1], got 2"),  # (the item named)
    ({"count": 1, "factors": [[0.5, float("nan")]]}, "part.factors[0][1]: must be a finite number in [0, 1], got nan"),
    ({"count": 1, "factors": [None, [0.5, "abc"]]}, "part.factors[1][1]: expected float, got 'abc'"),
    ({"count": 1, "factors": [0.5]}, "part.factors[0]: expected a list of float, got 0.5"),
    ({"heads": "mean"}, "part.count: missing"),
    ({"count": 1, "cuont": 2}, "unknown key part.cuont (did you mean 'count'?)"),
    ([1, 2], "part: expected a mapping with the keys count, heads, factors, note, got [1, 2]"),
    (None, "part: expected a mapping"),
])
def test_every_problem_is_one_error_naming_the_place_and_key(values, message):
    with pytest.raises(XattnError) as e:
        read_record(Record, values, "f.yaml: line 3", "part")
    assert message in str(e.value) and str(e.value).startswith("f.yaml: line 3: ")
    assert not isinstance(e.value, ConfigError)  # a file's problem, not a config key's
