"""Config overrides from the command line (`section.key=value`), and the keys older versions of xattn wrote into
every config.yaml that are no longer settings (dropped when read from a file, refused as overrides)."""
from __future__ import annotations

from collections.abc import Collection

from xattn.checks import nearest
from xattn.errors import XattnError


def parse_overrides(items: list[str], sections: Collection[str]) -> dict[str, dict[str, str]]:
    """`["train.lr=1e-3", "model.d_model=128"]` -> {"train": {"lr": "1e-3"}, "model": {"d_model": "128"}}."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot or not name:
            raise XattnError(f"override {item!r}: expected section.key=value, e.g. train.lr=5e-4")
        if section not in sections:
            raise XattnError(f"override {item!r}: unknown section {section!r}{nearest(section, list(sections))}")
        out.setdefault(section, {})[name] = value
    return out


RETIRED = {"decode": {"early_stopping": "decode.stopping (exact | early)"}}
"""Keys that older versions wrote into every model directory's config.yaml. Read from a file they are
dropped (their recorded value was the old default); given as an override they are an error naming the
replacement."""


def drop_retired(raw: dict, given: dict[str, dict[str, str]]) -> None:
    """Drop RETIRED keys from the sections of a config file's `raw` data; one given as an override is an error."""
    for section, keys in RETIRED.items():
        for key, replacement in keys.items():
            if key in given.get(section, {}):
                raise XattnError(f"{section}.{key} is no longer a setting; use {replacement}")
            if isinstance(raw.get(section), dict):
                raw[section] = {k: v for k, v in raw[section].items() if k != key}
