"""A PNG of the results (matplotlib, an optional extra): one panel per operation, one line per
implementation, bandwidth or time against size (or against ranks for start-up)."""

from __future__ import annotations

from typing import Any

from .report import Record
from .units import fmt_bytes

__all__ = ["plot", "figure"]


def _metric(records: list[Record], choice: str) -> str:
    if choice != "auto":
        return choice
    return "busbw" if any(r.busbw_gbs for r in records) else "time"


def plot(records: list[Record], path: str, metric: str = "auto") -> None:
    """Write ``path``; ``metric`` is ``busbw``, ``time`` or ``auto`` (bandwidth where there is one).
    The command line has made sure that matplotlib is there."""
    figure(records, metric).savefig(path, dpi=110)


def figure(records: list[Record], metric: str = "auto") -> Any:
    """The matplotlib figure that ``plot`` writes: sizes read 8 B, 4 KiB, 16 MiB on the x axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    sizes = FuncFormatter(lambda x, _: fmt_bytes(int(round(x))) if x >= 1 else "")

    panels: dict[tuple[str, str], list[Record]] = {}
    for record in records:  # an operation without sizes (barrier) has no curve to draw
        if record.us_max > 0 and (record.bytes or record.bench == "startup"):
            panels.setdefault((record.bench, record.op), []).append(record)
    drawn, axes = plt.subplots(len(panels), 1, figsize=(7, 3.6 * len(panels)), squeeze=False)
    for axis, ((bench, op), group) in zip(axes[:, 0], panels.items()):
        shown = _metric(group, metric)
        by_ranks = bench == "startup"
        for impl in dict.fromkeys(r.impl for r in group):
            mine = [r for r in group if r.impl == impl]
            xs = [r.ranks if by_ranks else r.bytes for r in mine]
            ys = [r.busbw_gbs if shown == "busbw" else r.us_max for r in mine]
            axis.plot(xs, ys, marker="o", label=impl)
        axis.set_xscale("log", base=2)
        if not by_ranks:
            axis.xaxis.set_major_formatter(sizes)
        axis.set_yscale("linear" if shown == "busbw" else "log")
        axis.set_xlabel("ranks" if by_ranks else "message size")
        axis.set_ylabel("bus bandwidth, GB/s" if shown == "busbw" else "time, µs (slowest rank)")
        first = group[0]
        axis.set_title(f"{bench}: {op}" + ("" if by_ranks else f", {first.ranks} ranks {first.dtype}"))
        axis.grid(True, which="both", alpha=0.3)
        axis.legend()
    drawn.tight_layout()
    return drawn
