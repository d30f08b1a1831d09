"""Figures that say where they were measured: `save_figure` stamps the provenance line onto the
figure itself and writes it to figures/ (or $INFER_FIGURES_DIR, which `make site` points at its
build folder so that the committed figures stay untouched)."""

import os
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from infer.paths import REPO_ROOT
from infer.provenance import provenance_line
from infer.timing import Timing

FIGURES_ENV_VAR = "INFER_FIGURES_DIR"


def figures_dir() -> Path:
    folder = Path(os.environ.get(FIGURES_ENV_VAR, REPO_ROOT / "figures"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def save_figure(fig: plt.Figure, name: str, meta: dict[str, str]) -> Path:
    """Stamp `meta` (from infer.provenance.provenance) on `fig` and save it as figures/<name>.png."""
    fig.tight_layout(rect=(0, 0.08, 1, 1))  # leave a strip at the bottom for the stamp
    fig.text(0.5, 0.01, provenance_line(meta), ha="center", va="bottom", fontsize=6.5, color="0.35", wrap=True)
    path = figures_dir() / f"{name}.png"
    fig.savefig(path, dpi=120)
    return path


def plot_medians(ax: plt.Axes, x, timings: list[Timing], *, scale: float = 1.0, **style):
    """Medians of `timings` against `x`, with p10-p90 error bars; `scale` converts from ms
    (1e-3 plots seconds). Returns matplotlib's ErrorbarContainer."""
    medians = np.array([t.median_ms for t in timings]) * scale
    spreads = np.array([t.spread_ms for t in timings]) * scale
    return ax.errorbar(x, medians, yerr=np.vstack([medians - spreads[:, 0], spreads[:, 1] - medians]),
                       capsize=3, **style)
