"""The README's "Writing a detector" example runs as written, outside the package."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _example() -> str:
    text = README.read_text()
    section = text[text.index("## Writing a detector"):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "the section has no python block"
    return match.group(1)


def test_the_readme_detector_runs_and_reports_its_finding(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "my_detector.py"
    script.write_text(_example())
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    # The user's finding, from the user's class, at the corrupted batch.
    assert "[warning] grad_norm_ceiling (gradients) at step 20" in done.stdout
    assert "above the ceiling 50" in done.stdout
