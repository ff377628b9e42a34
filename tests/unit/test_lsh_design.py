"""LSH banding design search (docs/methods.md §7): against a brute force over every (b, r) in the budget, a
hand-computed S-curve value, and the error when no layout fits."""

import pytest

from infra.errors import ConfigError
from tasks.corpus.lsh_design import LshConstraints, NoLayoutError, design_layouts, evaluate_layout, parse_layout


def _p(s: float, b: int, r: int) -> float:
    return 1.0 - (1.0 - s**r) ** b


def _brute(s1: float, p1: float, s2: float, p2: float, budget: int) -> list[tuple[int, int]]:
    found = []
    for b in range(1, budget + 1):
        for r in range(1, budget + 1):
            if b * r <= budget and _p(s1, b, r) >= p1 and _p(s2, b, r) <= p2:
                margin = min(_p(s1, b, r) - p1, p2 - _p(s2, b, r))
                found.append((b * r, -margin, b, r))
    return [(b, r) for _, _, b, r in sorted(found)]


@pytest.mark.parametrize("s1, p1, s2, p2, budget", [
    (0.8, 0.95, 0.5, 0.05, 256),
    (0.9, 0.9, 0.6, 0.1, 128),
    (0.7, 0.8, 0.3, 0.02, 128),
    (0.85, 0.99, 0.4, 0.01, 200),
])
def test_search_lists_exactly_the_brute_force_layouts_in_order(s1, p1, s2, p2, budget):
    got = design_layouts(LshConstraints(s1=s1, p1=p1, s2=s2, p2=p2, max_hashes=budget))
    assert [(lay.bands, lay.rows) for lay in got] == _brute(s1, p1, s2, p2, budget)
    assert all(lay.hashes == lay.bands * lay.rows and lay.meets for lay in got)


def test_realistic_constraint_needs_21_bands_of_9_rows():
    first = design_layouts(LshConstraints(s1=0.8, p1=0.95, s2=0.5, p2=0.05), limit=3)
    assert [(lay.bands, lay.rows) for lay in first] == [(21, 9), (22, 9), (23, 9)]
    assert first[0].p_at_s1 == pytest.approx(1 - (1 - 0.8**9) ** 21)
    assert first[0].threshold == pytest.approx((1 / 21) ** (1 / 9))


def test_hand_checked_layout_20_bands_of_5_rows():
    c = LshConstraints(s1=0.8, p1=0.95, s2=0.5, p2=0.05)
    lay = evaluate_layout(20, 5, c)
    # 0.8^5 = 0.32768; (1 - 0.32768)^20 = 0.67232^20 = 3.5606e-4 → P = 0.999644
    assert lay.p_at_s1 == pytest.approx(1 - (1 - 0.32768) ** 20) == pytest.approx(0.999644, abs=1e-6)
    # 0.5^5 = 0.03125; 0.96875^20 = 0.529949 → P = 0.470051: admits far too many pairs at 0.5
    assert lay.p_at_s2 == pytest.approx(0.470051, abs=1e-6)
    assert lay.margin == pytest.approx(0.05 - 0.470051, abs=1e-6) and not lay.meets
    assert lay.threshold == pytest.approx(0.05 ** 0.2)


def test_no_layout_in_budget_names_the_best_achievable_and_the_budget_needed():
    with pytest.raises(NoLayoutError, match=r"best achievable: \d+x\d+ .*fewest hashes that meet them: 21x9 = 189"):
        design_layouts(LshConstraints(s1=0.8, p1=0.95, s2=0.5, p2=0.05, max_hashes=112))
    budget = 112
    best = max(((min(_p(0.8, b, r) - 0.95, 0.05 - _p(0.5, b, r)), b, r) for b in range(1, budget + 1)
                for r in range(1, budget // b + 1)))
    with pytest.raises(NoLayoutError, match=f"best achievable: {best[1]}x{best[2]} "):
        design_layouts(LshConstraints(s1=0.8, p1=0.95, s2=0.5, p2=0.05, max_hashes=budget))


def test_constraints_and_layouts_are_checked():
    with pytest.raises(ConfigError, match="s2=0.9 must be below s1=0.8"):
        LshConstraints(s1=0.8, p1=0.95, s2=0.9, p2=0.05)
    with pytest.raises(ConfigError, match="p2=0.95 must be below p1=0.9"):
        LshConstraints(s1=0.8, p1=0.9, s2=0.5, p2=0.95)
    with pytest.raises(ConfigError, match="p1=1.5 must lie in"):
        LshConstraints(s1=0.8, p1=1.5, s2=0.5, p2=0.05)
    assert LshConstraints.parse("s1=0.8, p1=0.95,s2=0.5,p2=0.05", max_hashes=64) == LshConstraints(
        s1=0.8, p1=0.95, s2=0.5, p2=0.05, max_hashes=64)
    with pytest.raises(ConfigError, match="missing"):
        LshConstraints.parse("s1=0.8,p1=0.95")
    with pytest.raises(ConfigError, match="'q=1' is not one of"):
        LshConstraints.parse("s1=0.8,p1=0.95,s2=0.5,p2=0.05,q=1")
    assert parse_layout("20x10") == (20, 10) and parse_layout("14×8") == (14, 8)
    with pytest.raises(ConfigError, match="not <bands>x<rows>"):
        parse_layout("20-10")
