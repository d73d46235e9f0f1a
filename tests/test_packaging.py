"""A wheel built from this checkout works on its own: installed into a fresh environment and run from a
folder outside the checkout, `xattn quickstart` and `xattn train PRESET` find the presets it ships."""
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY_QUICKSTART = ["--minutes", "0.05", "--examples", "1", "data.numbers_size=2000", "model.d_model=32",
                   "model.d_ff=64", "train.eval_every=20", "train.eval_bleu_sentences=20", "train.threads=1"]


def _run(cmd: list, cwd: Path, what: str, code: int = 0) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
    result = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == code, f"{what}: exit {result.returncode}\n{result.stdout[-1500:]}\n{result.stderr[-3000:]}"
    return result


def _build_wheel(tmp: Path) -> Path:
    """Build from a copy of the sources, so no build/ or egg-info lands in the checkout and none is reused."""
    src = tmp / "src"
    shutil.copytree(ROOT / "xattn", src / "xattn", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", tmp / "dist", src],
         tmp, "building the wheel (needs setuptools>=70.1 here: pip install -e '.[test]')")
    return next((tmp / "dist").glob("xattn-*.whl"))


def _fresh_env(tmp: Path, wheel: Path) -> Path:
    """A venv with the wheel installed; torch and the other dependencies are seen from this environment.

    A venv made from inside a venv sees the base interpreter's site-packages, not ours, so a .pth file adds
    ours. It is written after the install, so pip never sees this checkout's (editable) xattn; a plain path
    line does not run the editable-install hook that lives there.
    """
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], tmp, "creating the venv")
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel], tmp,
         "installing the wheel")
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp, "python").stdout
    (Path(purelib.strip()) / "outer-env.pth").write_text("".join(f"{p}\n" for p in site.getsitepackages()))
    return venv


def test_wheel_installs_and_runs_outside_the_checkout(tmp_path):
    wheel = _build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n for n in names if n.startswith("xattn/configs/")}
    assert shipped == {f"xattn/configs/{p.name}" for p in (ROOT / "xattn" / "configs").glob("*.yaml")}
    static = "xattn/serve/static/"  # the page, whose heatmap.js and .css analysis/html.py also inlines
    assert {n for n in names if n.startswith(static)} == {static + p.name for p in (ROOT / static).iterdir()}
    venv = _fresh_env(tmp_path, wheel)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    where = _run([venv / "bin" / "python", "-c", "import xattn, xattn.presets as c; "
                  "print(xattn.__file__); print(c.resolve_config('numbers-de-en'))"], elsewhere, "import").stdout
    assert all(Path(line).is_relative_to(venv) for line in where.split()), where

    result = _run([venv / "bin" / "xattn", "quickstart", *TINY_QUICKSTART], elsewhere, "xattn quickstart")
    assert "exact match" in result.stdout
    assert (elsewhere / "runs" / "quickstart-numbers" / "attention.png").read_bytes()[:4] == b"\x89PNG"

    # the preset is found by name (else: "config file not found"), then its keys are checked
    typo = _run([venv / "bin" / "xattn", "train", "numbers-de-en", "train.max_step=2"], elsewhere, "train", code=2)
    assert "did you mean 'max_steps'" in typo.stderr, typo.stderr
