"""The run configs shipped inside the package (xattn/configs/NAME.yaml), and how a config argument names one."""
from __future__ import annotations

from pathlib import Path

from xattn.errors import XattnError

PRESET_DIR = Path(__file__).resolve().parent / "configs"


def presets() -> list[str]:
    """Names of the run configs shipped inside the package (xattn/configs/NAME.yaml)."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def resolve_config(arg: str | Path) -> Path:
    """A run config: `arg` itself if it is a file, else the packaged preset it names (`numbers-de-en[.yaml]`)."""
    path = Path(arg)
    if path.is_file():
        return path
    preset = PRESET_DIR / f"{path.name.removesuffix('.yaml')}.yaml"
    if len(path.parts) == 1 and preset.is_file():
        return preset
    if path.is_dir():  # (it said "config file not found")
        raise XattnError(f"{arg}: is a directory, not a config file (a YAML file, or a preset: {', '.join(presets())})")
    raise XattnError(f"{arg}: config file not found, and no preset of that name "
                     f"(presets: {', '.join(presets())})")
