"""What the page's plots share: the colour of each kind of work (the timeline's bars, the theory's
curves, the CSS legend of the token stream), their style on the light and the dark theme, and the
placeholder figure shown before a run. Plotly only; no run records.
"""

from __future__ import annotations

import plotly.graph_objects as go

# One colour per kind of work; the same colours are used by the CSS legend of the token stream.
KIND_COLORS = {"prefill": "#94a3b8", "draft": "#3b82f6", "verify": "#22c55e", "flushed": "#f59e0b"}
KIND_LABELS = {"prefill": "prefill (prompt)", "draft": "draft (stage 1 + exit head)",
               "verify": "verify / forward", "flushed": "flushed (wasted)"}
CORRECTION_COLOR = "#ef4444"

GRID = "rgba(128,128,128,0.25)"
FONT = "#8a8f98"  # mid grey: readable on the light and the dark theme alike


def describe(fig: go.Figure, text: str) -> go.Figure:
    """`fig` with its text alternative, `text`: what it shows, in words, for a reader who cannot
    see it (the page names the drawn plot by it, `app.ui.PLOT_ALT_JS`)."""
    fig.update_layout(meta={"alt": text})
    return fig


def empty_figure(message: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=14, color=FONT))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    style(fig, None, height=220)
    return describe(fig, message)


def style(fig: go.Figure, title: str | None, *, height: int) -> None:
    # The legend sits under the plot: above it, it collides with the title and subplot titles.
    fig.update_layout(
        title=dict(text=title, font=dict(size=20), x=0.01, xanchor="left", yref="container", y=1,
                                    yanchor="top", pad=dict(t=26)) if title else None, height=height,
        margin=dict(l=10, r=10, t=60 if title else 20, b=20),
        paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)", font=dict(color=FONT, size=14),
        legend=dict(orientation="h", yanchor="top", y=-0.18, x=0, bgcolor="rgba(0,0,0,0)"),
        hoverlabel=dict(align="left"),
    )
    fig.update_xaxes(gridcolor=GRID, zerolinecolor=GRID)
    fig.update_yaxes(gridcolor=GRID, automargin=True)
    fig.update_annotations(font=dict(color=FONT))

