"""The bench's figures: every row's ratio against its target, and per-token time with and without the KV cache."""

from __future__ import annotations

from .rows import Row


def plot(rows: list[Row], curves: dict | None, device_name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..course.plotting import save_figure, use_course_style

    use_course_style()
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.5))
    names = [r.name for r in rows][::-1]
    meds = [r.median for r in rows][::-1]
    err = [[r.median - min(r.ratios) for r in rows][::-1], [max(r.ratios) - r.median for r in rows][::-1]]
    ax.barh(names, meds, xerr=err, color="tab:blue", alpha=0.8)
    for i, r in enumerate(rows[::-1]):
        if r.target is not None:
            ax.plot([r.target, r.target], [i - 0.4, i + 0.4], color="tab:red", lw=2)
    ax.set_xscale("log")
    ax.set(xlabel="ratio (median, min-max); red: the course's target", title=f"helpers.bench on {device_name}")
    save_figure(fig, "bench_summary", show=False)
    if curves:
        fig, ax = plt.subplots()
        for label, ys in curves.items():
            ax.plot(range(1, len(ys) + 1), [y * 1e3 for y in ys], label=label)
        ax.set(
            yscale="log",
            xlabel="generated token",
            ylabel="ms per token (median)",
            title=f"Per-token time with and without the KV cache ({device_name})",
        )
        ax.legend()
        save_figure(fig, "bench_cache_latency", show=False)
