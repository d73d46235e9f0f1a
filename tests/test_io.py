"""xattn.io: JSON that is JSON (no NaN or Infinity)."""
import json
import math

from xattn.io import json_text


def test_json_text_writes_non_finite_numbers_as_null_and_parses_strictly():
    value = {"coverage": [0.5, math.nan], "over": math.inf, "nested": [{"low": -math.inf}], "pair": (1.0, 2)}
    text = json_text(value)
    strict = json.loads(text, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
    assert strict == {"coverage": [0.5, None], "over": None, "nested": [{"low": None}], "pair": [1.0, 2]}
    assert "NaN" not in text and "Infinity" not in text
