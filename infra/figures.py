"""Writing matplotlib figures as files: no display on workers or in CI; labelling points without overlaps."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.text import Annotation, Text  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402


def save_figure(fig, path: Path, layout: bool = True) -> Path:
    """Lay out ``fig`` (unless ``layout`` is False: it was laid out before its labels were placed), write it to
    ``path`` (format from the suffix), close it; returns ``path``."""
    if layout:
        fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


# Label positions around a point, nearest first: offsets in points, as (dx, dy) directions × radii.
_DIRECTIONS = ((1, 1), (1, -1), (-1, 1), (-1, -1), (0, 1), (0, -1), (1, 0), (-1, 0))
_RADII_PT = (4, 10, 18, 28, 40, 54)
_LEADER_FROM_PT = 18  # a label at least this far from its point gets a thin line to it


def label_points(ax, points: Sequence[tuple[float, float]], labels: Sequence[str], *, fontsize: float = 7,
                 marker_pt: float = 4) -> list[Annotation]:
    """Annotate each data point with its label, where the label overlaps no other label, no point (a square of
    ``marker_pt`` points either side) and stays inside the axes: each takes the nearest free position of a few
    directions × radii around its point (the greedy placement of cartographic point labelling), else the one that
    overlaps least. A label placed away from its point gets a thin line to it. Returns the annotations.

    Positions are measured on the drawn figure: call after its layout is final (``tight_layout``) and save without
    laying it out again (``save_figure(..., layout=False)``)."""
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    scale = fig.dpi / 72  # display pixels per point
    half = marker_pt * scale
    marks = [Bbox.from_extents(x - half, y - half, x + half, y + half)
             for x, y in ax.transData.transform(np.asarray(points, dtype=float).reshape(-1, 2))]
    placed: list[Bbox] = []
    annotations = []
    for point, label in zip(points, labels):
        probe = ax.annotate(label, point, xytext=(0, 0), textcoords="offset points", fontsize=fontsize)
        best = None
        for radius in _RADII_PT:
            for dx, dy in _DIRECTIONS:
                _aim(probe, dx, dy, radius)
                box = _text_box(probe, renderer)
                outside = box.width * box.height - _shared_area(box, frame)
                cost = round(sum(_shared_area(box, other) for other in placed + marks) + outside, 3)  # pixels²
                if best is None or cost < best[0]:
                    best = (cost, dx, dy, radius)
            if best[0] == 0:
                break
        probe.remove()
        _, dx, dy, radius = best
        leader = {"arrowstyle": "-", "color": "grey", "linewidth": 0.5} if radius >= _LEADER_FROM_PT else None
        ann = ax.annotate(label, point, xytext=(0, 0), textcoords="offset points", fontsize=fontsize,
                          arrowprops=leader)
        _aim(ann, dx, dy, radius)
        placed.append(_text_box(ann, renderer))
        annotations.append(ann)
    return annotations


def _aim(ann: Annotation, dx: int, dy: int, radius: float) -> None:
    """Put ``ann``'s text ``radius`` points from its point in direction (dx, dy), its near corner or edge there."""
    ann.xyann = (dx * radius, dy * radius)
    ann.set_horizontalalignment({1: "left", 0: "center", -1: "right"}[dx])
    ann.set_verticalalignment({1: "bottom", 0: "center", -1: "top"}[dy])


def _text_box(ann: Annotation, renderer) -> Bbox:
    """The box of ``ann``'s text alone, in display pixels (``Annotation.get_window_extent`` adds its line)."""
    ann.update_positions(renderer)  # places the text at its offset from the point
    return Text.get_window_extent(ann, renderer)


def _shared_area(a: Bbox, b: Bbox) -> float:
    both = Bbox.intersection(a, b)
    return 0.0 if both is None else both.width * both.height
