"""Figures of a sweep report: accuracy against compute with the Pareto frontier (pareto.png), and accuracy against
training progress per run (curves.png)."""

from __future__ import annotations

from matplotlib.figure import Figure

from vit_jax.report.pareto import PAPER_METRIC, Row, pareto_frontier
from vit_jax.report.plotting import new_figure, save_figure
from vit_jax.sweep.runs import RunState

# family (summary.json model.family) -> (marker, colour, legend label). The labels are Figure 5's of the ViT paper,
# which draws the three families of its Table 6 in three colours on the compute axis.
STYLE = {
    "ViT": ("o", "tab:blue", "Transformer (ViT)"),
    "ResNet": ("^", "tab:green", "ResNet (BiT)"),
    "Hybrid": ("s", "tab:orange", "Hybrid"),
}
PROGRESS = {"examples": ("examples_seen", "examples seen"), "epochs": ("epoch", "epochs"),
            "steps": ("step", "steps"), "exaflops": ("exaflops", "training compute [exaFLOPs]")}


def _style(family: str) -> tuple[str, str, str]:
    return STYLE.get(family, ("D", "tab:purple", family))


def _short(row: Row) -> str:
    epochs = f" {row.epochs:.3g}ep" if row.epochs is not None else ""
    return f"{row.model}{epochs}"


def _panel(ax, rows: list[Row], cost_of, metric: str, xlabel: str, paper: list[Row] = ()) -> None:
    """Scatter of accuracy against a cost, one style per family, the frontier as a staircase."""
    points = [(cost_of(r), r.accuracy[metric], r) for r in rows
              if cost_of(r) is not None and cost_of(r) > 0 and metric in r.accuracy]
    for family, pretraining in sorted({(r.family, r.label_free) for _, _, r in points}):
        marker, colour, label = _style(family)
        mine = [(c, a) for c, a, r in points if (r.family, r.label_free) == (family, pretraining)]
        if pretraining:  # fine-tuned from a label-free run: a star, its x the compute of both
            marker, label = "*", f"{label}, label-free pretraining + fine-tuning"
        ax.scatter([c for c, _ in mine], [a for _, a in mine], marker=marker, color=colour,
                   s=90 if pretraining else 40, label=label, zorder=3)
    for c, a, r in points:
        ax.annotate(_short(r), (c, a), textcoords="offset points", xytext=(4, 4), fontsize=6, color="0.3")
    if points:
        on = pareto_frontier([c for c, _, _ in points], [a for _, a, _ in points])
        front = sorted((c, a) for (c, a, _), o in zip(points, on) if o)
        # Best accuracy reachable with at most this much compute: flat until the next frontier point.
        ax.step([c for c, _ in front], [a for _, a in front], where="post", color="black", lw=1, zorder=2,
                label="Pareto frontier")
        ax.scatter([c for c, _ in front], [a for _, a in front], s=120, facecolors="none", edgecolors="black",
                   lw=1, zorder=4)
    for r in paper:
        marker, colour, label = _style(r.family)
        ax.scatter([r.exaflops], [r.accuracy[PAPER_METRIC]], marker=marker, facecolors="none", edgecolors=colour,
                   s=40, zorder=3, label=f"paper Table 6: {label}")
        ax.annotate(_short(r), (r.exaflops, r.accuracy[PAPER_METRIC]), textcoords="offset points", xytext=(4, -8),
                    fontsize=6, color=colour)
    if not points and not paper:
        ax.text(0.5, 0.5, f"no finished run reports\n{metric} and this cost", ha="center", va="center",
                transform=ax.transAxes)
    else:
        ax.set_xscale("log")
        # A log axis spanning about one decade labels its minor ticks too (2x10^-4, 3x10^-4, ...): tilt them so
        # they do not run into each other.
        ax.tick_params(axis="x", which="both", labelrotation=30, labelsize=7)
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles))  # one legend entry per label (paper points come one by one)
        ax.legend(unique.values(), unique.keys(), fontsize=7, loc="lower right")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"{metric} [%]")
    ax.grid(True, alpha=0.3)


def pareto_figure(rows: list[Row], metric: str, device_label: str, path, paper: list[Row] = ()) -> Figure:
    """pareto.png: accuracy vs pretraining exaFLOPs (paper points optional) and vs device time.

    One marker and colour per model family (ViT, ResNet, Hybrid), as the paper's Figure 5; returns the figure drawn.
    """
    fig = new_figure(12, 5)
    ax1, ax2 = fig.subplots(1, 2)
    _panel(ax1, rows, lambda r: r.exaflops, metric, "pretraining compute [exaFLOPs]", paper)
    if paper:
        ax1.set_title(f"sweep: {metric}; ViT paper Table 6: ImageNet top-1 after fine-tuning", fontsize=9)
    _panel(ax2, rows, lambda r: r.device_days, metric, f"pretraining compute [{device_label}]")
    save_figure(fig, path)
    return fig


def data_size_figure(rows: list[Row], metric: str, path) -> Figure:
    """data.png: accuracy against the size of the training set, one line per model coloured by family (the shape of
    the paper's Figures 3 and 4: which family wins on small data, and where the other overtakes it)."""
    fig = new_figure(7, 5)
    ax = fig.subplots()
    points = [r for r in rows if r.train_examples and metric in r.accuracy]
    for model in sorted({r.model for r in points}):
        mine = sorted((r.train_examples, r.accuracy[metric], r.family) for r in points if r.model == model)
        marker, colour, label = _style(mine[0][2])
        ax.plot([n for n, _, _ in mine], [a for _, a, _ in mine], marker=marker, color=colour,
                label=f"{model} ({label})")
    if points:
        ax.set_xscale("log")
        ax.legend(fontsize=7, loc="lower right")
    else:
        ax.text(0.5, 0.5, f"no finished run reports {metric}", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("training examples")
    ax.set_ylabel(f"{metric} [%]")
    ax.set_title(f"{metric} against training-set size", fontsize=9)
    ax.grid(True, alpha=0.3)
    save_figure(fig, path)
    return fig


def curves_figure(states: list[RunState], metric: str, progress: str, path) -> None:
    """curves.png: `metric` against training progress for every run that logged it."""
    key, label = PROGRESS[progress]
    fig = new_figure(9, 5)
    ax = fig.subplots()
    drawn = 0
    for s in states:
        pts = sorted(s.curve(metric, key))
        if not pts:
            continue
        style = "-" if s.finished else "--"  # dashed: the run has not finished
        ax.plot([x for x, _ in pts], [100 * y for _, y in pts], style, marker=".", lw=1.2, label=s.name)
        drawn += 1
    if drawn:
        ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
        if progress == "exaflops":
            ax.set_xscale("log")
    else:
        ax.text(0.5, 0.5, f"no run logged {metric} with {key}", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel(label)
    ax.set_ylabel(f"{metric} [%]")
    ax.set_title(f"{metric} during training (dashed: unfinished)", fontsize=9)
    ax.grid(True, alpha=0.3)
    save_figure(fig, path)
