"""matplotlib for the benchmarks' PNGs, when it is installed (it is optional),
and the units their axes and titles speak."""

from __future__ import annotations

from typing import Any

from pyinit.errors import as_utf8


def pyplot() -> Any | None:
    """matplotlib.pyplot on the file-only Agg backend, or None without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Any, dpi: int = 110) -> bool:
    """Lays out, writes and closes a figure (pyplot keeps every open one
    alive); True, so a plot function can end with ``return save_figure(...)``.
    A title naming a file whose name is not UTF-8 shows those bytes as \\xNN:
    the font cannot draw a surrogate escape."""
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    for text in fig.findobj(Text):
        text.set_text(as_utf8(text.get_text()))
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return True


def human_bytes(size: float) -> str:
    """8 B, 64 KiB, 1.5 GiB: binary units, as the sizes on the command lines are."""
    for unit, factor in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor:
            return f"{size / factor:.4g} {unit}"
    return f"{size:.4g} B"


def bytes_axis(ax: Any) -> None:
    """A log2 x axis of byte counts, labelled 32 B, 1 KiB, 32 KiB ... 1 GiB."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=32))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: human_bytes(value)))
