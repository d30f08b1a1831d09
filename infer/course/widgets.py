"""Interactive controls for the lectures, where moving a slider teaches more than reading a table.

`phase_split_explorer`: pick a prompt length and an output length and see, from the measured
prefill/decode sweep, which phase dominates a request's latency, and what each phase costs per
token (the reason APIs price input tokens below output tokens). The figure is drawn once when the
control is created, so an executed notebook stores its initial state for the static site. There no
Python runs to redraw it: the site shows the sliders disabled, under a note that says to run the
notebook in Jupyter (site/static/course.js)."""

import ipywidgets
import matplotlib.pyplot as plt

from infer.experiments.prefill_decode import PhaseTiming
from infer.plotting import COLUMN_WIDTH_IN, make_legible, stamp_provenance


def request_latency_split_ms(row: PhaseTiming, output_tokens: int) -> dict[str, float]:
    """A single request's time in each phase, from medians: prefill gives the first token, then
    one decode step per further token (each step timed at this prompt's context length)."""
    if output_tokens < 1:
        raise ValueError(f"output_tokens must be >= 1, got {output_tokens}")
    return {
        "prefill (until the first token)": row.prefill.median_ms,
        f"decode ({output_tokens - 1} more steps)": (output_tokens - 1) * row.decode_step.median_ms,
    }


def draw_phase_split(row: PhaseTiming, output_tokens: int, meta: dict[str, str] | None = None) -> plt.Figure:
    """Top: one request's time per phase. Bottom: what one prompt token and one output token cost.
    Stacked, so that both stay legible in the site's column."""
    split = request_latency_split_ms(row, output_tokens)
    per_token = {
        "prompt token\n(prefill / prompt length)": row.prefill.median_ms / row.prompt_len,
        "output token\n(one decode step)": row.decode_step.median_ms,
    }
    ratio = per_token["output token\n(one decode step)"] / per_token["prompt token\n(prefill / prompt length)"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(COLUMN_WIDTH_IN, 5.4))
    fig.suptitle(
        f"One request: {row.prompt_len} prompt + {output_tokens} output tokens, "
        f"{sum(split.values()):,.0f} ms in all (from measured medians)"
    )
    for ax, values, unit in ((top, split, "ms"), (bottom, per_token, "ms per token")):
        bars = ax.barh(list(values), list(values.values()), color=["C0", "C1"])
        ax.bar_label(bars, labels=[f"{v:.3g}" if v < 100 else f"{v:,.0f}" for v in values.values()], padding=3)
        ax.set_xlabel(f"time ({unit})")
        ax.set_xlim(0, max(values.values()) * 1.25)  # room for the value labels
    top.set_title("where the request's time goes")
    bottom.set_title(f"per token: an output token costs {ratio:,.0f}x a prompt token")
    make_legible(fig)
    if meta is None:
        fig.tight_layout()
    else:
        stamp_provenance(fig, meta)
    return fig


def phase_split_explorer(
    rows: list[PhaseTiming],
    meta: dict[str, str] | None = None,
    initial_prompt_len: int | None = None,
    initial_output_tokens: int = 64,
):
    """Sliders over the measured prompt lengths and an output length; redraws `draw_phase_split`.
    Display the returned widget (make it the last expression of a cell)."""
    by_length = {row.prompt_len: row for row in rows}
    lengths = sorted(by_length)
    prompt_slider = ipywidgets.SelectionSlider(
        options=lengths,
        value=initial_prompt_len or lengths[len(lengths) // 2],
        description="prompt tokens",
        continuous_update=False,
        style={"description_width": "initial"},
    )
    output_slider = ipywidgets.IntSlider(
        value=initial_output_tokens,
        min=1,
        max=1024,
        step=1,
        description="output tokens",
        continuous_update=False,
        style={"description_width": "initial"},
    )

    def redraw(prompt_tokens: int, output_tokens: int) -> None:
        draw_phase_split(by_length[prompt_tokens], output_tokens, meta)
        plt.show()

    # `interactive` (unlike `interact`) returns the widget, and draws the initial state right away.
    return ipywidgets.interactive(redraw, prompt_tokens=prompt_slider, output_tokens=output_slider)
