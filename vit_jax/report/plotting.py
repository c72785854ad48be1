"""Matplotlib helpers (Agg canvas, no pyplot: no GUI backend and no global figure state) and the figures of the
paper's model analyses (Fig. 6 and 7)."""

from __future__ import annotations

import io

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from vit_jax.sweep.runs import as_path


def new_figure(width: float, height: float) -> Figure:
    """A figure drawn by the Agg backend, whatever backend the process has selected."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Figure, path, dpi: int = 120) -> None:
    """Writes `fig` as PNG to a local or remote (gs://) path."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    as_path(path).write_bytes(buf.getvalue())


def _mosaic(tiles: np.ndarray, rows: int, cols: int, gap: int = 1) -> np.ndarray:
    """(rows*cols, h, w[, c]) tiles -> one image with NaN gaps between them (drawn blank)."""
    n, h, w = tiles.shape[:3]
    extra = tiles.shape[3:]
    out = np.full((rows * (h + gap) - gap, cols * (w + gap) - gap, *extra), np.nan, np.float32)
    for i in range(n):
        r, c = divmod(i, cols)
        out[r * (h + gap): r * (h + gap) + h, c * (w + gap): c * (w + gap) + w] = tiles[i]
    return out


def attention_distance_figure(distance: np.ndarray, title: str, path) -> None:
    """Fig. 7 (right): one dot per head, x = layer (1-based), y = mean attention distance in pixels."""
    depth, heads = distance.shape
    fig = new_figure(6, 4.5)
    ax = fig.subplots()
    layers = np.repeat(np.arange(1, depth + 1), heads)
    colours = np.tile(np.arange(heads), depth)
    ax.scatter(layers, distance.reshape(-1), c=colours, cmap="tab20", s=18, vmin=0, vmax=max(heads - 1, 1))
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_ylim(bottom=0)  # as in the paper: distances read against the image size, not zoomed in
    ax.set_xticks(np.arange(1, depth + 1, max(1, depth // 12)))
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    save_figure(fig, path)


def posemb_similarity_figure(similarity: np.ndarray, title: str, path) -> None:
    """Fig. 7 (centre): for each patch (gh x gw grid of tiles), its cosine similarity to every patch (gh x gw map)."""
    gh, gw = similarity.shape[:2]
    image = _mosaic(similarity.reshape(gh * gw, gh, gw), gh, gw)
    fig = new_figure(6, 6 * gh / gw + 0.6)
    ax = fig.subplots()
    im = ax.imshow(np.ma.masked_invalid(image), cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlabel("input patch column")
    ax.set_ylabel("input patch row")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, shrink=0.8, label="cosine similarity")
    save_figure(fig, path)


def embedding_pcs_figure(components: np.ndarray, title: str, path, cols: int = 7) -> None:
    """Fig. 7 (left): the top principal components of the RGB patch-embedding filters, each rescaled to [0, 1]."""
    n = components.shape[0]
    rows = -(-n // cols)
    fig = new_figure(cols * 1.0, rows * 1.0 + 0.5)
    axes = np.asarray(fig.subplots(rows, cols)).reshape(-1)
    for i, ax in enumerate(axes):
        ax.axis("off")
        if i < n:
            ax.imshow(components[i], interpolation="nearest")
    fig.suptitle(title, fontsize=8)
    save_figure(fig, path)


def attention_rollout_figure(images: np.ndarray, masks: np.ndarray, title: str, path) -> None:
    """Fig. 6: each input image next to it multiplied by its rollout mask (normalised to a maximum of 1)."""
    n = images.shape[0]
    fig = new_figure(4.4, 2.2 * n + 0.4)
    axes = np.asarray(fig.subplots(n, 2)).reshape(n, 2)
    for i in range(n):
        shown = np.clip((images[i] + 1) / 2, 0, 1)
        axes[i, 0].imshow(shown)
        axes[i, 1].imshow(shown * masks[i][..., None])
        for ax in axes[i]:
            ax.axis("off")
    axes[0, 0].set_title("input", fontsize=8)
    axes[0, 1].set_title("attention rollout", fontsize=8)
    fig.suptitle(title, fontsize=8)
    save_figure(fig, path)
