"""What a training run writes: the loss curves (PNG), the numbers (JSON) and the agreement of the
clients' losses over the first steps."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .run import Run

__all__ = ["AGREEMENT_STEPS", "agreement", "summary", "write"]

AGREEMENT_STEPS = 20


def agreement(runs: dict[str, Run], reference: str = "torch", steps: int = AGREEMENT_STEPS) -> dict[str, float]:
    """Per client, the largest relative difference of its loss from ``reference``'s over the first ``steps``."""
    if reference not in runs:
        return {}
    base = np.asarray(runs[reference].losses[:steps])
    return {c: float((np.abs(np.asarray(r.losses[:steps]) - base) / np.abs(base)).max()) for c, r in runs.items() if c != reference}


def summary(runs: dict[str, Run]) -> list[str]:
    lines = [f"{c:10s} held-out accuracy {r.accuracy[-1]:.3f}  {r.seconds_per_step * 1e3:.1f} ms/step  final loss {r.losses[-1]:.4f}"
             for c, r in runs.items()]  # fmt: skip
    lines += [f"{c:10s} loss vs torch over the first {AGREEMENT_STEPS} steps: max relative difference {d:.2e}" for c, d in agreement(runs).items()]
    return lines


def write(runs: dict[str, Run], out: Path, settings: dict) -> list[Path]:
    """``train.json`` and ``loss_curve.png`` under ``out``; returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    record = {"settings": settings, "agreement": agreement(runs),
              "runs": {c: {"losses": r.losses, "accuracy": r.accuracy, "seconds_per_step": r.seconds_per_step} for c, r in runs.items()}}  # fmt: skip
    (out / "train.json").write_text(json.dumps(record, indent=1))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for c, r in runs.items():
        ax.plot(r.losses, label=f"{c} ({r.seconds_per_step * 1e3:.0f} ms/step, accuracy {r.accuracy[-1]:.3f})", linewidth=1)
    ax.set_xlabel("SGD step")
    ax.set_ylabel("cross-entropy loss")
    ax.set_title("digits CNN (5 convs: strided, depthwise dilated, grouped), same weights and batches")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "loss_curve.png", dpi=120)
    plt.close(fig)
    return [out / "train.json", out / "loss_curve.png"]
