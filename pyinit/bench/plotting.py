"""matplotlib for the benchmarks' PNGs, when it is installed (it is optional)."""

from __future__ import annotations

from typing import Any


def pyplot() -> Any | None:
    """matplotlib.pyplot on the file-only Agg backend, or None without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
