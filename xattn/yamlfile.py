"""YAML files in: one document, read as UTF-8, a key given twice refused (YAML would keep the last silently), every
problem one line naming the file and line."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from xattn.errors import XattnError


def read_yaml(path: Path) -> Any:
    """The YAML document in `path`; a missing file, non-UTF-8 bytes, bad YAML or a key given twice in one
    mapping (YAML would keep the last silently) is a one-line XattnError naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise XattnError(f"{path}: {'is a directory, not a file' if path.is_dir() else 'file not found'}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise XattnError(f"{path}: line {line}: not UTF-8 text") from None
    try:
        return yaml.load(text, Loader=unique_key_loader())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}: line {mark.line + 1}" if mark else str(path)
        raise XattnError(f"{where}: invalid YAML ({yaml_problem(e)})") from None


def yaml_problem(e: Exception) -> str:
    """What a yaml.YAMLError says is wrong, on one line."""
    return " ".join(str(getattr(e, "problem", None) or e).split())


def unique_key_loader():
    """yaml.SafeLoader that refuses a mapping key given twice."""
    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`: its keys may be given again here
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    hash(key)
                except TypeError:  # (`[1, 0]: 1`; `key in seen` raised it, a traceback, before YAML's own check)
                    raise yaml.constructor.ConstructorError(None, None, "a list or mapping cannot be a key",
                                                            key_node.start_mark) from None
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"{key!r} is given twice",
                                                            key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep)
    return UniqueKeyLoader
