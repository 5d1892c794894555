"""Which weights ``RUN/final`` holds: the best by validation loss (default) or the last.

With validation data and ``train.final_model: best``, every evaluation that lowers the
validation loss exports the model to ``RUN/best/`` (written beside it, then swapped in, so a
crash leaves the previous best whole). At the end the last step's weights go to ``RUN/last/``
and ``RUN/best/`` becomes ``RUN/final/``; its ``dlmkit.json`` says which step it is
(``"selected": {"by": "validation_loss", "step", "validation_loss", "last_step"}``). Without
validation data, or with ``train.final_model: last``, ``RUN/final/`` is the last step (no
``best/`` or ``last/``). A resumed run keeps the best so far (read from ``best/`` or ``final/``).
"""

from __future__ import annotations

import json
import math
import shutil
import typing
from collections.abc import Callable
from pathlib import Path

from .config import FinalModel

FINAL_MODELS = typing.get_args(FinalModel)

Export = Callable[[str, dict], Path]  # (directory name under RUN, extra dlmkit.json fields)


def _selection(directory: Path) -> dict | None:
    try:
        return json.loads((directory / "dlmkit.json").read_text()).get("selected")
    except (FileNotFoundError, json.JSONDecodeError, AttributeError):
        return None


class BestModel:
    """Tracks the lowest validation loss of a run and keeps its weights in ``RUN/best/``."""

    def __init__(self, run_dir: Path, *, enabled: bool, is_main: bool) -> None:
        self.run_dir, self.enabled, self.is_main = Path(run_dir), enabled, is_main
        self.step: int | None = None
        self.loss = math.inf
        if not enabled:
            return
        best, final = self.run_dir / "best", self.run_dir / "final"
        previous = _selection(best) or _selection(final)  # a resumed run: its best so far
        if previous is not None:
            self.step, self.loss = int(previous["step"]), float(previous["validation_loss"])
            if is_main and not best.exists() and final.exists():
                final.rename(best)

    def offer(self, step: int, loss: float, export: Export) -> bool:
        """Export the model to ``RUN/best/`` if ``loss`` is the lowest so far (call on every
        rank: the export is collective)."""
        if not self.enabled or not math.isfinite(loss) or loss >= self.loss:
            return False
        self.step, self.loss = step, loss
        fresh = export(".best.tmp", {"selected": self._selected(None)})
        if self.is_main:
            best = self.run_dir / "best"
            if best.exists():
                shutil.rmtree(best)
            fresh.rename(best)
        return True

    def finish(self, last_step: int, export: Export) -> Path:
        """Write ``RUN/final`` (and ``RUN/last``) at the end of the run; returns ``final``."""
        final = self.run_dir / "final"
        if self.step is None:  # never validated (or disabled): the last step is the model
            return export("final", {})
        export("last", {})
        if self.is_main:
            best = self.run_dir / "best"
            if final.exists():
                shutil.rmtree(final)
            best.rename(final)
            meta_file = final / "dlmkit.json"
            meta = json.loads(meta_file.read_text())
            meta["selected"] = self._selected(last_step)
            meta_file.write_text(json.dumps(meta, indent=1))
        return final

    def _selected(self, last_step: int | None) -> dict:
        return {"by": "validation_loss", "step": self.step, "validation_loss": self.loss,
                "last_step": last_step}
