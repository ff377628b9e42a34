"""Writing matplotlib figures as files: no display on workers or in CI."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def save_figure(fig, path: Path) -> Path:
    """Lay out ``fig``, write it to ``path`` (format from the suffix), close it; returns ``path``."""
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
