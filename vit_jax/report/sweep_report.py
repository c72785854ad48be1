"""`vit-jax sweep report`: read every run of a sweep root and write pareto.png, scaling.png, curves.png, report.md,
report.html, results.csv and the scaling-law fits (scaling.json, scaling.csv) into ROOT/report/."""

from __future__ import annotations

import base64
import csv
import html
import io
import time

from vit_jax.report.pareto import (PAPER_METRIC, Row, accuracy_keys, device_time_unit, finetune_accuracy, paper_rows,
                                   sort_by_compute, sweep_rows)
from vit_jax.report.scaling import MIN_POINTS
from vit_jax.report.scaling_report import (LAW, MAX_EXTRAPOLATION, compute_fits, data_size_fits, evaluation_rows,
                                           fits_table, write_scaling)
from vit_jax.report.sweep_figures import curves_figure, data_size_figure, pareto_figure, scaling_figure
from vit_jax.sweep.runs import RunState, as_path, read_sweep_root


def _fmt(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def table(rows: list[Row], acc_keys: list[str], device_label: str,
          plain: bool = False) -> tuple[list[str], list[list[str]]]:
    """Header and formatted cells of the report table (markdown and HTML; `plain` numbers for CSV)."""
    header = ["pareto", "source", "model", "pretraining", "epochs", "steps", "params", "exaFLOPs", device_label, "img/s", "MFU",
              *[f"{k} [%]" for k in acc_keys], "run"]
    cells = []
    for r in rows:
        cells.append([
            "*" if r.pareto else "", r.source, r.model, r.pretraining, _fmt(r.epochs, ".3g"), _fmt(r.steps, "d"),
            _fmt(r.params, "d" if plain else ",d") if isinstance(r.params, int) else "", _fmt(r.exaflops, ".4g"),
            _fmt(r.device_days, ".4g"), _fmt(r.img_per_sec, ".1f"), _fmt(r.mfu, ".3f"),
            *[_fmt(r.accuracy.get(k), ".2f") for k in acc_keys], r.run,
        ])
    return header, cells


def _markdown_table(header: list[str], cells: list[list[str]]) -> str:
    def line(values):
        return "| " + " | ".join(v.replace("|", "\\|") for v in values) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *map(line, cells)])


def _incomplete(states: list[RunState], metric: str, finetuned: dict[str, dict[str, float]]) -> list[str]:
    """One line per run that is not in the table (or lacks the metric), with its problems."""
    lines = []
    for s in states:
        reasons = list(s.problems)
        if not s.finished:
            reasons.insert(0, f"status {s.status}" + (f", {s.steps} steps so far" if s.steps else ""))
        elif s.metric(metric) is None and metric not in finetuned.get(s.name, {}):
            reasons.insert(0, f"no {metric}")
        elif s.exaflops is None:
            reasons.insert(0, "no compute (summary.compute.exaflops)")
        if reasons:
            lines.append(f"{s.name}: " + "; ".join(reasons))
    return lines


def _html_table(header: list[str], cells: list[list[str]]) -> str:
    rows = "\n".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in cells)
    return f"<table><tr>{''.join(f'<th>{html.escape(h)}</th>' for h in header)}</tr>\n{rows}\n</table>"


def _html(title: str, intro: list[str], header: list[str], cells: list[list[str]], figures: dict[str, bytes],
          incomplete: list[str], fits: tuple[list[str], list[str], list[list[str]]]) -> str:
    fit_intro, fit_header, fit_cells = fits
    imgs = "\n".join(f'<h2>{html.escape(name)}</h2>\n<img alt="{html.escape(name)}" style="max-width:100%" '
                     f'src="data:image/png;base64,{base64.b64encode(png).decode()}">' for name, png in figures.items())
    missing = ("<h2>Runs not in the table</h2><ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in incomplete)
               + "</ul>") if incomplete else ""
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}
td:nth-child(2),td:nth-child(3),td:nth-child(4),td:last-child{{text-align:left}}
</style></head><body>
<h1>{html.escape(title)}</h1>
{''.join(f'<p>{html.escape(p)}</p>' for p in intro)}
{_html_table(header, cells)}
{missing}
<h2>Scaling-law fits</h2>
{''.join(f'<p>{html.escape(p)}</p>' for p in fit_intro)}
{_html_table(fit_header, fit_cells)}
{imgs}
</body></html>
"""


def write_report(root: str, *, metric: str = "eval/top1", compare_paper: bool = False, progress: str = "examples",
                 out_dir: str | None = None, finetune_roots: tuple[str, ...] = (), n_boot: int = 200,
                 seed: int = 0, fit_final_only: bool = False) -> list:
    """Writes the report of the sweep in `root`; returns the paths written.

    Each family's Pareto front (and the paper's, with `compare_paper`) is fitted with the saturating power law
    (scaling_report.compute_fits; `n_boot` bootstrap refits drawn with `seed` give the bands), a front of every
    evaluation the runs logged (only their final ones with `fit_final_only`); a data-size sweep's models are fitted
    against training-set size too.

    `finetune_roots`: sweep roots of fine-tuning runs started from this sweep's checkpoints (e.g.
    configs/sweeps/finetune_lr.py:DATASET,ROOT); their accuracy becomes `finetune/<dataset>/top1` of the pretraining
    run, plotted against its pretraining compute like the paper's Fig. 5 / Table 6."""
    states, problems = read_sweep_root(root)
    finetune_states = []
    for ft_root in finetune_roots:
        ft, ft_problems = read_sweep_root(ft_root)
        finetune_states += ft
        problems += ft_problems
    finetuned = finetune_accuracy(states, finetune_states)
    if finetune_roots and not finetuned:
        problems.append(f"no finished fine-tuning run in {', '.join(map(str, finetune_roots))} starts from a run of "
                        f"{root} (their init.checkpoint must name a run's workdir)")
    out = as_path(out_dir) if out_dir else as_path(root) / "report"
    out.mkdir(parents=True, exist_ok=True)
    device_key, device_label = device_time_unit([s for s in states if s.finished])
    rows = sweep_rows(states, metric, device_key, finetuned)
    acc_keys = accuracy_keys([s for s in states if s.finished], metric, finetuned)
    paper = paper_rows() if compare_paper else []
    if paper:
        acc_keys.append(PAPER_METRIC)
    all_rows = sort_by_compute(rows + paper)

    fit_rows = rows if fit_final_only else rows + evaluation_rows(states, rows, metric)
    fits = compute_fits(fit_rows, metric, n_boot=n_boot, seed=seed)
    fits += compute_fits(paper, PAPER_METRIC, "paper", n_boot=n_boot, seed=seed) if paper else []
    data_sweep = len({r.train_examples for r in rows if r.train_examples}) > 1  # a data-size sweep (data.fraction)
    if data_sweep:
        fits += data_size_fits(rows, metric, n_boot=n_boot, seed=seed)
    pareto_path, scaling_path, curves_path = out / "pareto.png", out / "scaling.png", out / "curves.png"
    pareto_figure(rows, metric, device_label, pareto_path, paper, [g for g in fits if g.cost == "exaflops"])
    scaling_figure(fits, scaling_path)
    curves_figure(states, metric, progress, curves_path)
    figures = {"Accuracy against compute": pareto_path, "Error against compute: scaling-law fits": scaling_path,
               "Training curves": curves_path}
    if data_sweep:
        figures["Accuracy against training-set size"] = out / "data.png"
        data_size_figure(rows, metric, figures["Accuracy against training-set size"],
                         [g for g in fits if g.cost == "train_examples"])
    fit_paths = write_scaling(out, fits, n_boot=n_boot, seed=seed)

    header, cells = table(all_rows, acc_keys, device_label)
    csv_path = out / "results.csv"
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerows([header, *table(all_rows, acc_keys, device_label, plain=True)[1]])
    csv_path.write_text(buf.getvalue())

    finished = sum(s.finished for s in states)
    title = f"Sweep report: {root}"
    intro = [f"{len(states)} runs, {finished} finished; accuracy metric {metric}; generated "
             f"{time.strftime('%Y-%m-%d %H:%M')}.",
             "Rows are sorted by pretraining compute; '*' marks the Pareto frontier (no other run has at most the "
             "compute and at least the accuracy, one strictly)."]
    if any(r.pretraining for r in rows):
        intro.append("A run started from another run of the report (init.checkpoint) counts that run's compute too; "
                     "'pretraining' says what that run learnt from: labels (supervised) or none (label-free).")
    if paper:
        intro.append("Paper rows: ViT paper Table 6 (JFT-300M pretraining, ImageNet top-1 after fine-tuning at "
                     "384 px); they are not part of the frontier.")
    incomplete = problems + _incomplete(states, metric, finetuned)
    front_of = "final evaluations" if fit_final_only else "evaluations (during training too, RUN@STEP)"
    fit_intro = [f"Each family's Pareto front of its runs' {front_of} is fitted with {LAW} (Zhai et al. 2022), E "
                 f"the error (100 - accuracy, %) and C the pretraining exaFLOPs (or, for a data-size sweep, each "
                 f"model's runs against training examples): least squares on log E with a >= 0, 0 < b <= 5, "
                 f"0 <= c <= min E, 0 <= d <= max C. Brackets: {n_boot} residual-bootstrap refits, 95% percentile "
                 f"intervals (seed {seed}). A fit needs {MIN_POINTS} points; fewer are refused. Curves are dashed "
                 f"beyond the largest measured cost; `vit-jax sweep suggest` answers for budgets up to "
                 f"{MAX_EXTRAPOLATION:g}x beyond it. Full fits: scaling.json, scaling.csv."]
    fit_header, fit_cells = fits_table(fits)

    md = [f"# {title}", "", *[p + "\n" for p in intro], _markdown_table(header, cells), ""]
    if incomplete:
        md += ["## Runs not in the table", "", *[f"- {x}" for x in incomplete], ""]
    md += ["## Scaling-law fits", "", *[p + "\n" for p in fit_intro], _markdown_table(fit_header, fit_cells), ""]
    for name, path in figures.items():
        md += [f"## {name}", "", f"![{path.stem}]({path.name})", ""]
    md_path = out / "report.md"
    md_path.write_text("\n".join(md))
    html_path = out / "report.html"
    html_path.write_text(_html(title, intro, header, cells, {name: path.read_bytes() for name, path in figures.items()},
                               incomplete, (fit_intro, fit_header, fit_cells)))
    return [*figures.values(), md_path, html_path, csv_path, *fit_paths]
