"""`dlmkit.masks` in two visible parts: the engine and the catalogue.

The engine is every module directly in ``dlmkit/masks/`` (``Mask``, tiles, block construction,
rendering, padding, and the masks the dLLM families train and decode with); the catalogue is
``dlmkit/masks/catalogue/`` (the patterns no family uses). Imports run catalogue -> engine
only. The package's ``__init__`` (the public facade), ``catalog`` (the example table behind
``dlmkit mask``) and ``benchmark`` sit over both and may import both.

Before: one flat folder of 29 modules, the catalogue's ~2,600 lines beside the engine's, with
nothing to say which was which or to stop the engine from depending on a gallery pattern.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dlmkit.masks
import dlmkit.masks.catalogue
from dlmkit.masks import catalog

MASKS = Path(dlmkit.masks.__file__).parent
CATALOGUE = MASKS / "catalogue"
# Over both parts: the facade re-exports the catalogue, the example table and the benchmark
# list and measure its examples.
OVER_BOTH = {"dlmkit.masks", "dlmkit.masks.catalog", "dlmkit.masks.benchmark"}

# dlmkit.masks.__all__ before the split: the move keeps every public name.
PUBLIC = {
    "EMPTY", "FULL", "KIND_CLEAN", "KIND_GLOBAL", "KIND_NOISED", "Mask", "MaskCache", "PARTIAL",
    "Slot", "TokenTags", "batchify", "bidirectional", "block_diffusion", "block_diffusion_decode",
    "canvas", "canvas_encoder", "causal", "causal_decode", "chunk_causal", "dflash",
    "dflash_decode", "dilated_sliding_window", "document", "expert_cross", "expert_self",
    "flamingo", "global_sliding_window", "hybrid", "idlm", "idlm_decode", "jetspec_training",
    "jetspec_tree", "merge_attention", "natten", "packed_causal_document", "prefix_lm",
    "shared_prefix", "sliding_window", "sta", "svg_spatial", "svg_temporal", "vsa",
    "window_tags",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(MASKS.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(MASKS.rglob("*.py"))}


def imported(path: Path, known: set[str]) -> list[tuple[int, str]]:
    """``(line, module)`` for every import in ``path``, relative ones resolved. ``from P import
    x`` counts as importing ``P`` (for a package that runs its ``__init__`` and binds what it
    re-exports: ``from dlmkit.masks import causal`` is the facade's function) and also ``P.x``
    where that is a module."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names
                      if f"{base}.{alias.name}" in known]
    return found


def dynamic_imports(path: Path) -> list[int]:
    """Lines calling ``importlib.import_module`` or ``__import__``: imports the AST check
    cannot follow."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__"):
                lines.append(node.lineno)
    return lines


def part(module: str) -> str:
    if module in OVER_BOTH:
        return "over both"
    if module == "dlmkit.masks.catalogue" or module.startswith("dlmkit.masks.catalogue."):
        return "catalogue"
    if module.startswith("dlmkit.masks."):
        return "engine"
    if module == "dlmkit" or module.startswith("dlmkit."):
        return "rest of dlmkit"
    return "outside"


def test_every_module_has_a_part():
    """A new sub-folder would escape the import rules below: each module is engine (directly
    in masks/), catalogue (in catalogue/) or one of the modules over both."""
    for name, path in modules().items():
        assert path.parent in (MASKS, CATALOGUE) or name in OVER_BOTH, path
    assert OVER_BOTH <= set(modules())


def test_engine_never_imports_the_catalogue():
    known = set(modules())
    bad = []
    for name, path in modules().items():
        if part(name) != "engine":
            continue
        for line, target in imported(path, known):
            if part(target) not in ("engine", "outside"):
                bad.append(f"{path.relative_to(MASKS)}:{line} imports {target} "
                           f"({part(target)})")
        bad += [f"{path.relative_to(MASKS)}:{line} imports by name at run time"
                for line in dynamic_imports(path)]
    assert not bad, "the engine imports only the engine and torch:\n" + "\n".join(bad)


def test_catalogue_imports_only_the_engine_and_itself():
    known = set(modules())
    bad = []
    for name, path in modules().items():
        if part(name) != "catalogue":
            continue
        for line, target in imported(path, known):
            if part(target) not in ("engine", "catalogue", "outside"):
                bad.append(f"{path.relative_to(MASKS)}:{line} imports {target} "
                           f"({part(target)})")
    assert not bad, "\n".join(bad)


def test_every_public_name_is_kept():
    assert set(dlmkit.masks.__all__) == PUBLIC
    assert len(dlmkit.masks.__all__) == len(PUBLIC)
    for name in PUBLIC:
        assert getattr(dlmkit.masks, name) is not None, name
    for name in dlmkit.masks.catalogue.__all__:
        assert name in PUBLIC, name
        assert getattr(dlmkit.masks, name) is getattr(dlmkit.masks.catalogue, name), name


def defines_examples(path: Path) -> bool:
    return any(isinstance(node, ast.Assign)
               and any(getattr(t, "id", None) == "EXAMPLES" for t in node.targets)
               for node in ast.parse(path.read_text()).body)


def test_catalog_parts_follow_the_folders():
    """Every module with EXAMPLES is listed under the part its folder says, so no example is
    left out of `dlmkit mask list` and none is labelled with the wrong part."""
    listed = {p: {f"dlmkit.masks.{m}" for m in mods} for p, mods in catalog.PARTS.items()}
    assert set(listed) == {"engine", "catalogue"}
    for name, path in modules().items():
        if defines_examples(path):
            assert name in listed[part(name)], name
    for p, names in listed.items():
        for name in names:
            assert part(name) == p, name
            assert defines_examples(modules()[name]), name


def test_examples_split_into_engine_and_catalogue():
    every = catalog.examples()
    engine, gallery = catalog.examples("engine"), catalog.examples("catalogue")
    assert not set(engine) & set(gallery)
    assert {**engine, **gallery}.keys() == every.keys()
    assert list(every) == sorted(every)
    assert {"idlm", "block_diffusion", "canvas", "dflash", "causal_decode"} <= set(engine)
    assert {"sliding_window", "sta_2d", "vsa", "chunk_causal", "flamingo"} <= set(gallery)
    for name in every:
        assert catalog.part_of(name) == ("engine" if name in engine else "catalogue"), name


def test_catalog_names_the_parts_it_knows():
    with pytest.raises(ValueError, match=r"part must be one of 'engine', 'catalogue' or None, "
                                         r"got 'gallery'"):
        catalog.examples("gallery")
    with pytest.raises(ValueError, match=r"unknown mask 'sliding'; available: .*sliding_window"):
        catalog.part_of("sliding")
