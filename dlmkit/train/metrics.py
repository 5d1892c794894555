"""What a user sees: ``metrics.jsonl``, a progress bar, and a PNG loss curve."""

from __future__ import annotations

import json
from pathlib import Path


class MetricsLog:
    """``metrics.jsonl``, and with ``tensorboard`` (a directory) the same numbers as TensorBoard
    scalars ``<split>/<name>`` (``train/loss``, ``validation/loss``, ...) at their step."""

    def __init__(self, path: Path, enabled: bool, resume_step: int = 0,
                 tensorboard: Path | None = None) -> None:
        self.path = Path(path)
        self.enabled = enabled
        if enabled and resume_step and self.path.is_file():
            # Drop records past the checkpoint we resume from: they will be recomputed.
            kept = [line for line in self.path.read_text().splitlines()
                    if line and json.loads(line).get("step", 0) <= resume_step]
            self.path.write_text("".join(line + "\n" for line in kept))
        elif enabled:
            self.path.write_text("")
        self.board = None
        if enabled and tensorboard is not None:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: TensorBoard hides the events a previous session wrote past the
            # checkpoint we resume from (steps > resume_step), as metrics.jsonl drops them.
            self.board = SummaryWriter(str(tensorboard),
                                       purge_step=resume_step + 1 if resume_step else None)

    def write(self, record: dict) -> None:
        if self.enabled:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")
        if self.board is not None:
            split, step = record["split"], record["step"]
            for name, value in record.items():
                if name not in ("split", "step") and isinstance(value, (int, float)):
                    self.board.add_scalar(f"{split}/{name}", value, step)
            self.board.flush()  # a killed run keeps what it logged

    def close(self) -> None:
        if self.board is not None:
            self.board.close()
            self.board = None


def plot_curves(metrics_path: Path, out_path: Path, series, *, ylabel: str | None = None,
                log_scale: bool = False) -> Path | None:
    """A PNG of ``metrics.jsonl``'s records against their step: ``series`` holds
    ``(split, key, label, plot_kwargs)`` per line. None (nothing written) when the file has no
    training record."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [json.loads(line) for line in Path(metrics_path).read_text().splitlines() if line]
    if not any(r.get("split") == "train" for r in records):
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for split, key, label, kwargs in series:
        points = [(r["step"], r[key]) for r in records if r.get("split") == split]
        if points:
            ax.plot(*zip(*points), label=label, **kwargs)
    ax.set_xlabel("step")
    if ylabel:
        ax.set_ylabel(ylabel)
    if log_scale:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return Path(out_path)


def plot_loss_curve(metrics_path: Path, out_path: Path) -> Path | None:
    """Train and validation loss (``RUN/loss.png``)."""
    return plot_curves(metrics_path, out_path,
                       [("train", "loss", "train", {"linewidth": 1}),
                        ("validation", "loss", "validation", {"marker": "o"})],
                       ylabel="loss", log_scale=True)
