"""The end-of-run training-curve figure (loss, learning rate, eval accuracy against steps)."""

from __future__ import annotations

import io

# The object API, not pyplot: a file is all a run makes, so no backend, display or global figure registry is needed
# (pyplot's import and bookkeeping cost ~0.1 s of every run's start-up and end, and its figures live until closed).
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def plot_training_curves(rows: list[dict], title: str = "") -> bytes:
    """The figure as PNG bytes (the caller writes them: the workdir may be a bucket)."""
    def series(key):
        pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        return [p[0] for p in pts], [p[1] for p in pts]

    fig = Figure(figsize=(15, 4))
    FigureCanvasAgg(fig)  # drawn by Agg whatever backend the process has selected (a notebook's, say)
    axes = fig.subplots(1, 3)
    x, y = series("train/loss")
    axes[0].plot(x, y, label="train")
    ex, ey = series("eval/loss")
    if ex:
        axes[0].plot(ex, ey, "o-", label="eval")
    axes[0].set(xlabel="step", ylabel="loss", title="loss")
    axes[0].legend()
    x, y = series("train/lr")
    axes[1].plot(x, y)
    axes[1].set(xlabel="step", ylabel="learning rate", title="schedule")
    for key in ("eval/top1", "eval/top5"):
        x, y = series(key)
        if x:
            axes[2].plot(x, [100 * v for v in y], "o-", label=key)
    fewshot = sorted({k for r in rows for k in r if k.startswith("fewshot/")})
    for key in fewshot:
        x, y = series(key)
        axes[2].plot(x, [100 * v for v in y], "s--", label=key)
    axes[2].set(xlabel="step", ylabel="accuracy (%)", title="accuracy")
    if axes[2].lines:
        axes[2].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()
