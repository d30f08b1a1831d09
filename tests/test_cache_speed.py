"""infer.experiments.cache_speed: the figure of week 02's cache-write cost can be read whole."""

import matplotlib.pyplot as plt

from infer.experiments.cache_speed import GROWING, PREALLOCATED, plot_write_cost
from infer.plotting import save_figure
from infer.profiles import PROFILES
from infer.provenance import provenance
from infer.timing import Timing


def test_the_write_cost_figure_keeps_its_axis_labels_inside(tmp_path, monkeypatch):
    """Review F13: in figures/02_cache_write_cost.png (6.5 x 3.8 in, as week 02 draws it) the y label
    was cut off at "(ms, median"."""
    monkeypatch.setenv("INFER_FIGURES_DIR", str(tmp_path))
    contexts = (256, 1024, 4096, 16384)
    timings = {
        GROWING: [Timing((ms * 0.95, ms, ms * 1.05)) for ms in (0.085, 0.292, 0.747, 1.915)],
        PREALLOCATED: [Timing((ms * 0.95, ms, ms * 1.05)) for ms in (0.045, 0.045, 0.045, 0.026)],
    }
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    plot_write_cost(ax, contexts, timings)
    ax.set_title("Adding one token: torch.cat copies the past, in-place writes do not")
    save_figure(fig, "write_cost", provenance(PROFILES["cpu"], cpu_threads=1))
    fig.canvas.draw()
    figure_box = fig.bbox
    for label in (ax.yaxis.label, ax.xaxis.label, ax.title):
        box = label.get_window_extent()
        assert figure_box.x0 <= box.x0 and box.x1 <= figure_box.x1 and figure_box.y0 <= box.y0, label.get_text()
        assert box.y1 <= figure_box.y1, (
            f"the label {label.get_text()!r} runs past the figure's edge ({box.y1:.0f} > {figure_box.y1:.0f} px): "
            "break it over two lines or shorten it"
        )
    plt.close(fig)
