"""The docs and the packaging tell the truth.

Before: the README's mask catalogue listed names `dlmkit mask show` rejected (`document`,
`sta`, `merge_attention`); `pip install -e .` printed setuptools' deprecation banner for the
`license = {text = ...}` table.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dlmkit.cli import main

ROOT = Path(__file__).resolve().parents[1]


def documented_catalogue() -> list[str]:
    text = (ROOT / "docs" / "masks.md").read_text()
    start = text.index("The catalogue (each name drawable with `dlmkit mask show NAME`)")
    section = text[start:text.index("Beside them", start)]
    return re.findall(r"`([a-z_0-9]+)`", section)


def test_every_mask_the_docs_list_can_be_drawn(capsys):
    names = documented_catalogue()
    assert len(names) >= 28 and "sta" in names and "document" in names
    for name in names:
        assert main(["mask", "show", name, "--seq-len", "16", "--block-size", "4"]) == 0, name
    assert "sta: drawing example sta_2d (others: sta_3d)" in capsys.readouterr().out


def test_setup_prints_no_deprecation_banner(tmp_path):
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip("SPDX license strings need setuptools >= 77")
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copy(ROOT / "README.md", tmp_path)
    (tmp_path / "dlmkit").mkdir()
    (tmp_path / "dlmkit" / "__init__.py").write_text("")
    out = subprocess.run(
        [sys.executable, "-c", "import setuptools.build_meta as b, tempfile; "
         "b.prepare_metadata_for_build_wheel(tempfile.mkdtemp())"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Deprecat" not in out.stdout + out.stderr, (out.stdout + out.stderr)[-3000:]


def test_declared_package_data_exists():
    """Before: pyproject.toml shipped `dlmkit/configs/*.yaml`, which matches nothing (the
    configs are at the repository root and nothing in the package reads them)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = project["tool"].get("setuptools", {}).get("package-data", {})
    for package, patterns in declared.items():
        folder = ROOT / package.replace(".", "/")
        for pattern in patterns:
            assert list(folder.glob(pattern)), f"package-data {package}: {pattern} matches nothing"
