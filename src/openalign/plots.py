"""Figures: the one place openalign chooses matplotlib's backend, and the one way a figure is written.

    plt = plots.pyplot()             matplotlib.pyplot; the non-interactive Agg backend unless the process has
                                     already imported pyplot (a notebook's inline backend, a user's choice)
    plots.save(fig, path, dpi=110)   laid out, written as PNG under a temporary name and renamed (outputs.staged:
                                     a killed run leaves no half a PNG), and closed

Every report's figure is a PNG file, never a window: a server or a cluster node has no display, and a figure drawn
for a file must not change the backend a user's own plots use.
"""

from __future__ import annotations

import sys
from pathlib import Path

from openalign.outputs import staged

__all__ = ["pyplot", "save"]


def pyplot():
    """matplotlib.pyplot, with the Agg backend when nothing in this process has imported pyplot yet."""
    import matplotlib

    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path, dpi: int = 110) -> Path:
    """`fig`, tightly laid out, as the PNG `path` (written whole or not at all); the figure is closed."""
    plt = pyplot()
    try:
        fig.tight_layout()
        with staged(Path(path)) as tmp:
            fig.savefig(tmp, format="png", dpi=dpi)
    finally:
        plt.close(fig)
    return Path(path)
