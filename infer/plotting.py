"""Figures that can be read where they are shown, and that say where they were measured.

The course site shows a figure in a column about 780 px wide (sphinx-book-theme at desktop
widths); a phone shows it narrower and opens it full size on a tap. A figure drawn
COLUMN_WIDTH_IN wide, with no text smaller than MIN_FONT_PT, keeps every letter at least
MIN_TEXT_PX tall in that column. The course style (applied on import, like any matplotlib style)
draws at those sizes; `save_figure` holds every figure it saves to them, whoever drew it: it raises
smaller text, stacks a row of panels too wide for the column into one column, stamps the
provenance line in legible print, and writes figures/<name>.png (or $INFER_FIGURES_DIR, which
`make site` points at its build folder so that the committed figures stay untouched)."""

import os
from pathlib import Path

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.gridspec import GridSpec
from matplotlib.text import Text

from infer.paths import REPO_ROOT
from infer.provenance import provenance_line
from infer.timing import Timing

FIGURES_ENV_VAR = "INFER_FIGURES_DIR"

SITE_COLUMN_PX = 784  # the site's content column at desktop widths, where figures are read
MIN_TEXT_PX = 9  # the smallest text a reader should have to read there
MIN_FONT_PT = 8  # the smallest font any figure uses
COLUMN_WIDTH_IN = 7.5  # a figure this wide fills the column (inline at 100 dpi: 750 px, saved: 900 px)
SAVE_DPI = 120
# The widest figure whose MIN_FONT_PT text, shrunk into the column, is still MIN_TEXT_PX tall.
MAX_LEGIBLE_WIDTH_IN = MIN_FONT_PT / 72 * SITE_COLUMN_PX / MIN_TEXT_PX  # 9.7 in
PANEL_HEIGHT_IN = (3.0, 4.5)  # the height of each stacked panel: its row's height, within these limits

COURSE_STYLE = {
    "figure.figsize": (COLUMN_WIDTH_IN, 4.2),
    "savefig.dpi": SAVE_DPI,
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "legend.title_fontsize": 9,
    "figure.titlesize": 11,
}
mpl.rcParams.update(COURSE_STYLE)


def figures_dir() -> Path:
    folder = Path(os.environ.get(FIGURES_ENV_VAR, REPO_ROOT / "figures"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def save_figure(fig: plt.Figure, name: str, meta: dict[str, str]) -> Path:
    """Make `fig` legible (`make_legible`), stamp `meta` (from infer.provenance.provenance) under
    it and save it as figures/<name>.png. The figure keeps those changes, so that a notebook that
    shows it afterwards shows what was saved."""
    make_legible(fig)
    stamp_provenance(fig, meta)
    path = figures_dir() / f"{name}.png"
    fig.savefig(path, dpi=SAVE_DPI)
    return path


def make_legible(fig: plt.Figure) -> None:
    """Hold `fig` to the sizes the site can show: no text under MIN_FONT_PT, titles wrapped to the
    figure's width, and no figure wider than MAX_LEGIBLE_WIDTH_IN (a row of panels is stacked)."""
    if fig.get_figwidth() > MAX_LEGIBLE_WIDTH_IN:
        fit_to_column(fig)
    fig.canvas.draw()  # creates the tick labels, so that the loop below sees them
    for text in fig.findobj(Text):
        text.set_fontsize(max(text.get_fontsize(), MIN_FONT_PT))
    for title in [ax.title for ax in fig.axes] + fig.texts:  # fig.texts holds the suptitle
        title.set_wrap(True)


def fit_to_column(fig: plt.Figure) -> None:
    """Make `fig` COLUMN_WIDTH_IN wide. A row of panels becomes a column of them, each as tall as
    the row was (within PANEL_HEIGHT_IN), in the same order; a single column only gets narrower."""
    specs = [ax.get_subplotspec() for ax in fig.axes]
    grids = {spec.get_gridspec() for spec in specs if spec is not None}
    height = fig.get_figheight()
    if None not in specs and len(grids) == 1:
        rows, columns = grids.pop().get_geometry()
        if rows == 1 and columns > 1:
            stacked = GridSpec(columns, 1, figure=fig)
            for ax, spec in zip(fig.axes, specs):  # twin axes share their panel's spec, so they move with it
                ax.set_subplotspec(stacked[spec.colspan.start, 0])
            height = columns * float(np.clip(height, *PANEL_HEIGHT_IN))
    fig.set_size_inches(COLUMN_WIDTH_IN, height)


def stamp_provenance(fig: plt.Figure, meta: dict[str, str]) -> None:
    """Lay `fig` out above a strip that holds its provenance line, broken between its fields to
    fit the figure's width, in MIN_FONT_PT grey."""
    lines = wrap_fields(provenance_line(meta), chars_per_line(fig.get_figwidth()))
    strip_in = (len(lines) * 1.35 * MIN_FONT_PT / 72) + 0.1
    fig.tight_layout(rect=(0, strip_in / fig.get_figheight(), 1, 1))
    fig.text(
        0.5,
        0.05 / fig.get_figheight(),
        "\n".join(lines),
        ha="center",
        va="bottom",
        fontsize=MIN_FONT_PT,
        color="0.3",
        linespacing=1.35,
    )


def chars_per_line(width_in: float, font_pt: float = MIN_FONT_PT) -> int:
    """About how many characters of `font_pt` text fit across `width_in` (an average character
    of a sans-serif font is about 0.55 em wide)."""
    return int(width_in * 72 / (0.55 * font_pt))


def wrap_fields(line: str, width: int, separator: str = " | ") -> list[str]:
    """`line` broken into lines of at most `width` characters, between its fields where it can."""
    lines = []
    for field in line.split(separator):
        if lines and len(lines[-1]) + len(separator) + len(field) <= width:
            lines[-1] += separator + field
        else:
            lines.append(field)
    return lines


def plot_medians(ax: plt.Axes, x, timings: list[Timing], *, scale: float = 1.0, **style):
    """Medians of `timings` against `x`, with p10-p90 error bars; `scale` converts from ms
    (1e-3 plots seconds). Returns matplotlib's ErrorbarContainer."""
    medians = np.array([t.median_ms for t in timings]) * scale
    spreads = np.array([t.spread_ms for t in timings]) * scale
    return ax.errorbar(
        x, medians, yerr=np.vstack([medians - spreads[:, 0], spreads[:, 1] - medians]), capsize=3, **style
    )
