"""The end-of-run training-curve figure (loss, learning rate, eval accuracy against steps)."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt  # noqa: E402


def plot_training_curves(rows: list[dict], title: str = "") -> bytes:
    """The figure as PNG bytes (the caller writes them: the workdir may be a bucket)."""
    def series(key):
        pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        return [p[0] for p in pts], [p[1] for p in pts]

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
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
    plt.close(fig)
    return buf.getvalue()
