"""The ``bench/`` scripts (a folder of scripts, not a package) as modules, for their tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def bench_script(name: str):
    """``bench/<name>.py`` executed afresh as the module ``bench_<name>``: each call a new
    module, so what one test changes in it never reaches another. It is registered in
    ``sys.modules`` while it runs (dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
