"""Figures of a sweep report: accuracy against compute with the Pareto frontier and each family's fitted scaling law
(pareto.png), error against compute on log-log axes with the fits (scaling.png), accuracy against training-set size
(data.png), and accuracy against training progress per run (curves.png)."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from vit_jax.report.pareto import PAPER_METRIC, Row, pareto_frontier
from vit_jax.report.plotting import new_figure, save_figure
from vit_jax.report.scaling import PowerLawFit
from vit_jax.report.scaling_report import COSTS, FitGroup, curve_points
from vit_jax.sweep.runs import RunState

# family (summary.json model.family) -> (marker, colour, legend label). The labels are Figure 5's of the ViT paper,
# which draws the three families of its Table 6 in three colours on the compute axis; Swin's is ours.
STYLE = {
    "ViT": ("o", "tab:blue", "Transformer (ViT)"),
    "ResNet": ("^", "tab:green", "ResNet (BiT)"),
    "Hybrid": ("s", "tab:orange", "Hybrid"),
    "Swin": ("D", "tab:red", "Swin"),  # a hierarchical Transformer (models/swin_family.py), not in the paper
}
PROGRESS = {"examples": ("examples_seen", "examples seen"), "epochs": ("epoch", "epochs"),
            "steps": ("step", "steps"), "exaflops": ("exaflops", "training compute [exaFLOPs]")}


def _style(family: str) -> tuple[str, str, str]:
    return STYLE.get(family, ("D", "tab:purple", family))


def _short(row: Row) -> str:
    epochs = f" {row.epochs:.3g}ep" if row.epochs is not None else ""
    return f"{row.model}{epochs}"


def draw_fit(ax, fit: PowerLawFit, colour: str, label: str, accuracy: bool = True) -> None:
    """The fitted curve (solid over the measured costs, dashed beyond the largest: extrapolation) and its bootstrap
    band, as accuracy (100 - E) or as error."""
    inside, beyond = curve_points(fit)
    for xs, style, name in ((inside, "-", label), (beyond, "--", None)):
        y, (lo, hi) = fit.predict(xs), fit.band(xs)
        if accuracy:
            y, lo, hi = 100 - y, np.clip(100 - hi, 0, 100), 100 - lo
        ax.fill_between(xs, lo, hi, color=colour, alpha=0.12 if style == "-" else 0.07, lw=0, zorder=1)
        ax.plot(xs, y, style, color=colour, lw=1.3, zorder=2, label=name)


def _draw_fits(ax, fits: list[FitGroup], accuracy: bool = True) -> None:
    for g in fits:
        if g.fit is not None:
            _, colour, label = _style(g.points[0].family)
            prefix = "paper Table 6 fit" if g.source == "paper" else "fit"
            draw_fit(ax, g.fit, colour, f"{prefix}: {label} (b={g.fit.b:.2f}, c={g.fit.c:.1f}%)", accuracy)


def _panel(ax, rows: list[Row], cost_of, metric: str, xlabel: str, paper: list[Row] = (),
           fits: list[FitGroup] = ()) -> None:
    """Scatter of accuracy against a cost, one style per family, the frontier as a staircase, fitted laws if any."""
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
    if points or paper:
        # The points set the accuracy range; a band that runs off it at small compute (an error band can pass
        # 100%) is cut there rather than stretching the axis.
        low, high = ax.get_ylim()
        _draw_fits(ax, fits)
        ax.set_ylim(max(low, 0.0), min(high, 100.0 + 0.05 * (high - low)))
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


def pareto_figure(rows: list[Row], metric: str, device_label: str, path, paper: list[Row] = (),
                  fits: list[FitGroup] = ()) -> Figure:
    """pareto.png: accuracy vs pretraining exaFLOPs (paper points optional) and vs device time.

    One marker and colour per model family (ViT, ResNet, Hybrid), as the paper's Figure 5; the compute panel also
    draws each family's fitted law (`fits`, compute_fits) with its band. Returns the figure drawn.
    """
    fig = new_figure(12, 5)
    ax1, ax2 = fig.subplots(1, 2)
    _panel(ax1, rows, lambda r: r.exaflops, metric, "pretraining compute [exaFLOPs]", paper, fits)
    if paper:
        ax1.set_title(f"sweep: {metric}; ViT paper Table 6: ImageNet top-1 after fine-tuning", fontsize=9)
    _panel(ax2, rows, lambda r: r.device_days, metric, f"pretraining compute [{device_label}]")
    save_figure(fig, path)
    return fig


def data_size_figure(rows: list[Row], metric: str, path, fits: list[FitGroup] = ()) -> Figure:
    """data.png: accuracy against the size of the training set, one line per model coloured by family (the shape of
    the paper's Figures 3 and 4: which family wins on small data, and where the other overtakes it). A model with a
    fitted law (`fits`, data_size_fits) gets the law and its band instead of a polyline."""
    fig = new_figure(7, 5)
    ax = fig.subplots()
    points = [r for r in rows if r.train_examples and metric in r.accuracy]
    fitted = {g.group: g.fit for g in fits if g.fit is not None}
    for model in sorted({r.model for r in points}):
        mine = sorted((r.train_examples, r.accuracy[metric], r.family) for r in points if r.model == model)
        marker, colour, label = _style(mine[0][2])
        ax.plot([n for n, _, _ in mine], [a for _, a, _ in mine], marker=marker, color=colour,
                ls="none" if model in fitted else "-", label=f"{model} ({label})")
        if model in fitted:
            fit = fitted[model]
            draw_fit(ax, fit, colour, f"fit (b={fit.b:.2f}, c={fit.c:.1f}%)")
    if points:
        ax.set_xscale("log")
        ax.legend(fontsize=7, loc="lower right")
    else:
        ax.text(0.5, 0.5, f"no finished run reports {metric}", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("training examples")
    ax.set_ylabel(f"{metric} [%]")
    ax.set_title(f"{metric} against training-set size" + (" (dashed: extrapolated)" if fitted else ""), fontsize=9)
    ax.grid(True, alpha=0.3)
    save_figure(fig, path)
    return fig


def scaling_figure(groups: list[FitGroup], path, paper_metric: str = "") -> Figure:
    """scaling.png: error against compute on log-log axes (the axes of Zhai et al.'s fits), one panel per source
    (the sweep; the paper's Table 6): every run faint, each family's front filled, the fitted law with its band,
    solid over the measured compute and dashed beyond it. Refused fits are named in the panel."""
    sources = [s for s in ("sweep", "paper") if any(g.source == s and g.cost == "exaflops" for g in groups)]
    fig = new_figure(6.5 * max(len(sources), 1), 5)
    axes = fig.subplots(1, max(len(sources), 1), squeeze=False)[0]
    for ax, source in zip(axes, sources):
        mine = [g for g in groups if g.source == source and g.cost == "exaflops"]
        notes = []
        for g in mine:
            marker, colour, label = _style(g.points[0].family if g.points else g.group)
            # Filled: a run's final evaluation; hollow: one logged during training (evaluation_rows' RUN@STEP).
            for during, points in ((False, [r for r in g.points if "@" not in r.run]),
                                   (True, [r for r in g.points if "@" in r.run])):
                ax.scatter([r.exaflops for r in points], [100 - r.accuracy[g.metric] for r in points], marker=marker,
                           color=colour, facecolors="none" if during else colour, s=36, zorder=3,
                           label=None if during else f"{g.group} front ({len(g.points)} points; hollow: mid-run)")
            for r in g.points:
                if "@" not in r.run:
                    ax.annotate(_short(r), (r.exaflops, 100 - r.accuracy[g.metric]), textcoords="offset points",
                                xytext=(4, 4), fontsize=6, color="0.3")
            if g.fit is None:
                notes.append(g.refusal)
            else:
                draw_fit(ax, g.fit, colour, f"{label}: {g.fit.a:.3g}(C+{g.fit.d:.3g})^-{g.fit.b:.3g}+{g.fit.c:.3g}",
                         accuracy=False)
        if notes:
            ax.text(0.02, 0.02, "\n".join(notes), transform=ax.transAxes, fontsize=6, va="bottom", color="0.3")
        ax.set_xscale("log")
        ax.set_yscale("log")
        # Errors read as 12 and 20, not 1.2x10^1; minor ticks get labels only where a front spans less than a decade
        # of error (the paper's), where there would be no other label, and not where they would pile up.
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        low, high = ax.get_ylim()
        ax.yaxis.set_minor_formatter(plain if high < 10 * low else NullFormatter())
        ax.tick_params(axis="both", which="both", labelsize=7)
        metric = mine[0].metric if mine else ""
        title = ("ViT paper Table 6: ImageNet error after fine-tuning" if source == "paper"
                 else f"sweep: error = 100 - {metric}")
        ax.set_title(f"{title} (dashed: extrapolated; band: 95% bootstrap)", fontsize=8)
        ax.set_xlabel(COSTS["exaflops"])
        ax.set_ylabel("error [%]")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, loc="upper right")
    if not sources:
        axes[0].text(0.5, 0.5, "no run reports compute and the metric", ha="center", va="center",
                     transform=axes[0].transAxes)
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
