"""One family, one folder: nothing outside ``dlmkit/families/`` names a family, and the
registry is the only way in."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dlmkit
from dlmkit import families

PACKAGE = Path(dlmkit.__file__).parent
# Mask factories carry the names of the papers they come from (``block_diffusion``, ``idlm``,
# ``dflash``): attention patterns, not families; the masks know nothing of the families.
NOT_FAMILIES = ("masks",)
# (file, literal): a name that spells a family but means something else, with why.
SAME_SPELLING = {
    # hybrid's loss logs its autoregressive term as "ar" (metrics.jsonl), a loss term's name
    ("dlmkit/diffusion/losses.py", "ar"),
}


def named_families(path: Path) -> list[tuple[int, str]]:
    """``(line, name)`` of every string literal in ``path`` that is exactly a family's name
    (docstrings and f-string text included only where the whole literal is the name)."""
    names = set(families.names())
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                node.value in names:
            found.append((node.lineno, node.value))
    return found


def outside_the_families() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py"))
            if p.relative_to(PACKAGE).parts[0] not in ("families", *NOT_FAMILIES)]


def test_no_family_is_named_outside_its_folder():
    hits = [f"{p.relative_to(PACKAGE.parent)}:{line}: {name!r}"
            for p in outside_the_families() for line, name in named_families(p)
            if (str(p.relative_to(PACKAGE.parent)), name) not in SAME_SPELLING]
    assert not hits, "family names outside dlmkit/families/:\n" + "\n".join(hits)


def test_a_family_folder_names_only_itself_outside_its_record():
    """A family's modules may name the family itself (and import a family they build on: scdd
    extends mdlm, hybrid reuses bd3lm's block sampler), never another as a string; relations
    between families (``related``, ``also_decoded_by``) are declared in the record, the
    folder's ``__init__.py``."""
    hits = []
    for name in families.names():
        folder = PACKAGE / "families" / name
        for p in sorted(folder.rglob("*.py")):
            if p.name == "__init__.py":
                continue
            hits += [f"{p.relative_to(PACKAGE.parent)}:{line}: {other!r}"
                     for line, other in named_families(p) if other != name]
    # hybrid's ar mode is a decoding mode value that happens to spell the ar family's name.
    hits = [h for h in hits if not (h.startswith("dlmkit/families/hybrid/") and
                                    h.endswith("'ar'"))]
    assert not hits, "\n".join(hits)


def test_the_scan_finds_a_name(tmp_path):
    """The scan is not blind: a literal family name, alone or in a tuple, is found; the name
    inside longer text is not (help texts may mention families)."""
    probe = tmp_path / "probe.py"
    probe.write_text('A = ("mdlm", "scdd")\nB = "the mdlm sampler"\nif x == "bd3lm": pass\n')
    assert named_families(probe) == [(1, "mdlm"), (1, "scdd"), (3, "bd3lm")]


def imports_of(path: Path) -> set[str]:
    """Absolute names of the dlmkit modules ``path`` imports (relative imports resolved)."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {n for n in found if n.split(".")[0] == "dlmkit"}


@pytest.mark.parametrize("shared", ["diffusion", "masks", "data", "models", "decoding"])
def test_the_shared_machinery_never_imports_a_family(shared):
    hits = [f"{p.relative_to(PACKAGE.parent)} imports {name}"
            for p in sorted((PACKAGE / shared).rglob("*.py")) for name in imports_of(p)
            if name.startswith(("dlmkit.families", "dlmkit.strategies"))]
    assert not hits, "\n".join(hits)


def test_the_decoding_runtime_sits_below_the_families():
    """``dlmkit/decoding/`` (runner, commit rules, options, streams, scorers) imports no family
    and none of the entry points above it; the entry points of ``dlmkit/generate/`` reach a
    family only through the registry (:mod:`dlmkit.families`), never a family's own module."""
    hits = []
    for p in sorted((PACKAGE / "decoding").glob("*.py")):
        hits += [f"decoding/{p.name} imports {n}" for n in imports_of(p)
                 if n.startswith(("dlmkit.families", "dlmkit.strategies", "dlmkit.generate",
                                  "dlmkit.train", "dlmkit.serve", "dlmkit.rl"))]
    for p in sorted((PACKAGE / "generate").glob("*.py")):
        hits += [f"generate/{p.name} imports {n}" for n in imports_of(p)
                 if n.startswith("dlmkit.families")
                 and n not in ("dlmkit.families", "dlmkit.families.family")]
    assert not hits, "\n".join(hits)
