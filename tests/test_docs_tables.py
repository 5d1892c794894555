"""The docs' results tables are generated from docs/results/*.jsonl, and the docs' links resolve.

Before: tables were typed by hand and drifted from their data (configs/block_diffusion-tiny.yaml
documented at 99.6-100% exact match while its results file holds 97.5%; training.md's suite
tables had lost their `chat` column).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripts import bench_script

ROOT = Path(__file__).resolve().parents[1]




def _copy_pages(tmp_path: Path) -> Path:
    tables = bench_script("tables")
    for page in tables.pages(ROOT):
        target = tmp_path / page.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(page, target)
    return tmp_path


def test_every_generated_table_matches_its_results_file():
    stale, placed = bench_script("tables").regenerate(write=False)
    assert not stale, ("tables differ from docs/results/*.jsonl (edited by hand, or the data "
                       "changed): run `python bench/tables.py`\n" + "\n".join(stale))
    names = {p.split(": ", 1)[1] for p in placed}
    assert {"suite-byte", "suite-bpe", "suite-seeds", "bd-tiny-eval", "adapt"} <= names
    assert set(bench_script("tables").TABLES) == names, "a table definition is placed in no page"


def test_a_hand_edited_cell_is_named_and_regenerated(tmp_path):
    root = _copy_pages(tmp_path)
    page = root / "docs" / "training.md"
    text = page.read_text()
    start = text.index("<!-- table: suite-byte -->")
    cell = text.index("**92.5%**", start)
    page.write_text(text[:cell] + "**99.6%**" + text[cell + len("**92.5%**"):])

    stale, _ = bench_script("tables").regenerate(root, write=False)
    assert stale == ["docs/training.md: suite-byte"]
    assert "**99.6%**" in page.read_text()  # --check rewrites nothing

    bench_script("tables").regenerate(root)
    assert page.read_text() == text
    assert bench_script("tables").regenerate(root, write=False)[0] == []


def test_the_adapt_table_written_by_bench_adapt_is_checked_too(tmp_path):
    root = _copy_pages(tmp_path)
    page = root / "docs" / "adapt.md"
    text = page.read_text()
    page.write_text(text.replace("2.741 bits/byte", "2.000 bits/byte", 1))
    assert bench_script("tables").regenerate(root, write=False)[0] == ["docs/adapt.md: adapt"]


def test_check_exits_1_naming_the_stale_table(tmp_path):
    root = _copy_pages(tmp_path)
    page = root / "docs" / "sampling.md"
    page.write_text(page.read_text().replace("97.7 / 99.2 / 98.4%", "99.6 / 100.0 / 100.0%", 1))
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "tables.py"), "--check",
                          "--root", str(root)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "docs/sampling.md: bd-tiny-eval" in out.stderr


def test_markers_that_name_no_definition_or_never_end_are_errors(tmp_path):
    tables = bench_script("tables")
    with pytest.raises(ValueError, match=r"page\.md: unknown table 'suite-typo'; .*suite-byte"):
        tables.sections("<!-- table: suite-typo -->\n<!-- /table -->\n", "page.md")
    with pytest.raises(ValueError, match=r"page\.md: table 'serve' has no '<!-- /table -->'"):
        tables.sections("<!-- table: serve -->\n| a |\n", "page.md")


def test_a_cell_listed_for_the_wrong_run_is_an_error(monkeypatch):
    tables = bench_script("tables")
    runs = dict(tables.SUITE_RUNS["byte"]["mdlm"], arith="z-ar-arith")
    monkeypatch.setitem(tables.SUITE_RUNS["byte"], "mdlm", runs)
    with pytest.raises(ValueError, match=r"'z-ar-arith' is \('ar', 'arith', 'byte', 0\), "
                                         r"listed for \('mdlm', 'arith', 'byte', 0\)"):
        tables.TABLES["suite-byte"](tables.RESULTS)


def test_a_bad_results_line_names_the_file_and_line(tmp_path):
    (tmp_path / "serve.jsonl").write_text('{"family": "ar"}\nnot json\n')
    with pytest.raises(ValueError, match=r"serve\.jsonl:2: not a JSON line"):
        bench_script("tables").load("serve.jsonl", tmp_path)


# -- links -------------------------------------------------------------------------------------
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown page (outside code fences)."""
    out, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif line.startswith("#") and not fenced:
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^a-z0-9 _-]", "", title).replace(" ", "-"))
    return out


def test_every_relative_link_in_the_readme_and_docs_resolves():
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
        for target in _LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}: ({target})"
            if not file.exists():
                broken.append(f"{where}: no such file")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
                broken.append(f"{where}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_readme_is_a_front_page_with_every_family():
    """Before: 476 lines, its own-data guide at line 287 and no link per family."""
    from dlmkit.strategies import names

    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; the front page keeps <= 150"
    make = (ROOT / "Makefile").read_text()
    for target in ("demo", "test"):
        assert re.search(rf"^{target}:", make, re.MULTILINE), f"Makefile has no {target} target"
        assert any(line.startswith(f"make {target}   # ") for line in lines), target
    assert lines.index("## Train on your own data") < lines.index("## Families")
    for family in names():
        row = [line for line in lines if line.startswith(f"| `{family}`")]
        assert len(row) == 1, f"README's families table has {len(row)} rows for {family}"
        assert f"(docs/families/{family}.md)" in row[0], f"{family}'s row links no page"
