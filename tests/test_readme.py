"""The README's Python snippets run as written (one failed once: `xattn.analysis.figure` after `import xattn`)."""
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.S | re.M)


def test_the_readme_python_snippets_run_in_a_fresh_interpreter(numbers_model, tmp_path):
    """A fresh process, so nothing this test session imported (xattn.analysis, say) can hide a missing import;
    the quickstart's model directory is stood in for by a small trained one."""
    blocks = python_blocks()
    assert blocks, "the README has no Python snippet"
    script = tmp_path / "readme.py"
    script.write_text("\n".join(blocks).replace("runs/quickstart-numbers", str(numbers_model)))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                            env={"MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-3000:]
