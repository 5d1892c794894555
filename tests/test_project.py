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


# A figure followed by "% of the" is a fraction that defines a value (``warmup_steps: None =
# 10% of the steps``), not a result; every other percentage in a comment reports one.
_PERCENT = re.compile(r"(?<![\w.])\d+(?:\.\d+)?%(?! of the )")
_FAMILY_POINTER = re.compile(r"docs/families/([a-z_0-9]+\.md)(?:#([a-z0-9_-]+))?")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown page."""
    return {re.sub(r"[^a-z0-9 _-]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in page.read_text().splitlines() if line.startswith("#")}


def test_code_comments_hold_no_measurement_logs():
    """Comments say why; measurements go in the docs (DESIGN.md). Before: 72 comment lines of
    the package were measurement logs (`0.2 gave 93.5% with the default 400 x 64`); they now
    live in docs/families/<family>.md#why-these-defaults, and a comment points there — so each
    such pointer must name a page and a heading that exist."""
    import io
    import tokenize

    logs, broken = [], []
    for path in sorted((ROOT / "dlmkit").rglob("*.py")):
        where = path.relative_to(ROOT)
        for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if tok.type != tokenize.COMMENT:
                continue
            if _PERCENT.search(tok.string):
                logs.append(f"{where}:{tok.start[0]}: {tok.string.strip()}")
            for page, anchor in _FAMILY_POINTER.findall(tok.string):
                target = ROOT / "docs" / "families" / page
                if not target.is_file() or (anchor and anchor not in _anchors(target)):
                    broken.append(f"{where}:{tok.start[0]}: docs/families/{page}#{anchor}")
    assert not logs, ("measurement logs in code comments; move the figures to the family's "
                      "docs page and leave a one-line why with a pointer:\n" + "\n".join(logs))
    assert not broken, "comments point to missing docs pages or headings:\n" + "\n".join(broken)
