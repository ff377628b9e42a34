"""The gate's scatter (``tasks.gate.stage.decision_figure``): candidate names placed by ``infra.figures.label_points``
never overlap one another, even when the candidates' points crowd together, as the demo's CPT grid does."""

from itertools import combinations

import numpy as np
import pandas as pd
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from evals.gate import GateConfig, GateCriterion
from infra.figures import label_points
from tasks.gate.stage import decision_figure

GATE = GateConfig(criteria=[
    GateCriterion(name="domain_gain", metric="domain_loss_reduction_nats", op=">=", threshold=0.05),
    GateCriterion(name="general_forgetting", metric="general_loss_rise_nats", op="<=", threshold=0.10)])


def _table(points: list[tuple[float, float]]) -> pd.DataFrame:
    """Candidates named as the CPT grid names them, one at each (domain reduction, general rise), the first kept."""
    rows = []
    for i, (x, y) in enumerate(points):
        rows.append({"candidate": f"replay{0.1 * (1 + i % 3):.1f}_lr{3e-4 * (1 + i // 3):.4g}", "kept": i == 0,
                     "decision": ("pass", "fail", "undetermined")[i % 3],
                     "domain_loss_reduction_nats": x, "domain_loss_reduction_nats_ci_low": x - 0.02,
                     "domain_loss_reduction_nats_ci_high": x + 0.02,
                     "general_loss_rise_nats": y, "general_loss_rise_nats_ci_low": y - 0.01,
                     "general_loss_rise_nats_ci_high": y + 0.01})
    return pd.DataFrame(rows)


def _label_boxes(fig) -> tuple[list[Bbox], list[Bbox]]:
    """Each label's text box as drawn, and where the box would be at the fixed offset of (4, 4) points."""
    fig.canvas.draw()  # as saved: every annotation at its place
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    boxes, fixed = [], []
    for text in ax.texts:
        box = Text.get_window_extent(text, renderer)
        px, py = ax.transData.transform(text.xy)
        shift = 4 * fig.dpi / 72
        boxes.append(box)
        fixed.append(Bbox.from_bounds(px + shift, py + shift, box.width, box.height))
    return boxes, fixed


def _overlapping(boxes: list[Bbox]) -> list[tuple[int, int]]:
    return [(i, j) for (i, a), (j, b) in combinations(enumerate(boxes), 2) if a.overlaps(b)]


def test_crowded_candidate_names_do_not_overlap():
    # Four candidates within a few hundredths of a nat (the demo's grid), two more close by, one far away.
    crowd = [(0.061, 0.021), (0.063, 0.022), (0.062, 0.019), (0.065, 0.020), (0.070, 0.024), (0.058, 0.018),
             (0.40, 0.15)]
    fig = decision_figure(_table(crowd), GATE)
    boxes, fixed = _label_boxes(fig)
    assert len(boxes) == len(crowd)
    assert _overlapping(fixed), "not crowded: names at a fixed offset would not overlap either"
    assert _overlapping(boxes) == []
    page = fig.bbox
    assert all(page.x0 <= b.x0 and b.x1 <= page.x1 and page.y0 <= b.y0 and b.y1 <= page.y1 for b in boxes)


def test_a_label_away_from_its_point_is_drawn_with_a_line_to_it_and_a_free_one_without():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 3), dpi=100)
    points = [(0.5, 0.5)] * 10 + [(0.05, 0.95)]
    ax.set(xlim=(0, 1), ylim=(0, 1))
    fig.tight_layout()
    annotations = label_points(ax, points, [f"candidate {i}" for i in range(11)])
    fig.canvas.draw()
    boxes = [Text.get_window_extent(a, fig.canvas.get_renderer()) for a in annotations]
    assert _overlapping(boxes) == []
    assert annotations[0].arrow_patch is None  # the first at a point takes the nearest place
    assert any(a.arrow_patch is not None for a in annotations[1:10])
    assert np.allclose(annotations[10].xy, points[10])
    plt.close(fig)
