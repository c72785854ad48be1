"""The scaling-law part of a sweep report: which points each fit takes, scaling.json / scaling.csv, the fits table,
and `vit-jax sweep suggest` (the error a compute budget buys, and the model and length that buy it).

Against compute, a family's fit takes its Pareto front only (Zhai et al. fit the front: a run that another run of
the family beats at lower compute says how not to spend compute, not what compute buys). The front is drawn from every
evaluation the runs logged, not only their final ones (evaluation_rows): a run evaluated at a third of its length is a
measurement of what that compute bought, and a small sweep has too few runs for a four-parameter law otherwise.
Against training-set size (a data-fraction sweep, where every run spends the same compute) each model's runs are one
curve.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math

import numpy as np

from vit_jax.report.pareto import Row, pareto_frontier
from vit_jax.report.scaling import LAW, PARAMS, PowerLawFit, ScalingFitError, fit_power_law
from vit_jax.sweep.runs import RunState

SCALING_JSON = "scaling.json"
# A fit speaks for compute within this factor of its data, no further: the law's saturation c is set by the
# measured points, and a decade beyond them it is already a guess (the issue's "far beyond the data").
MAX_EXTRAPOLATION = 10.0
COSTS = {"exaflops": "pretraining compute [exaFLOPs]", "train_examples": "training examples"}


@dataclasses.dataclass
class FitGroup:
    """One fitted (or refused) curve: a family's front against compute, or a model's runs against data size."""

    source: str  # "sweep" | "paper"
    group: str  # the family (compute) or the model (data size)
    cost: str  # a key of COSTS
    metric: str  # the accuracy whose complement is fitted
    points: list[Row]
    fit: PowerLawFit | None = None
    refusal: str | None = None

    def to_dict(self) -> dict:
        out = {"source": self.source, "group": self.group, "cost": self.cost, "metric": self.metric,
               "error_definition": f"100 - {self.metric.removeprefix('paper: ')} [%]",
               "status": "fitted" if self.fit else "refused",
               "points": [{"run": r.run, "model": r.model, "family": r.family, "params": r.params, "steps": r.steps,
                           "epochs": r.epochs, "exaflops": r.exaflops, "train_examples": r.train_examples,
                           "pretraining": r.pretraining, "error": 100 - r.accuracy[self.metric]}
                          for r in self.points]}
        if self.fit:
            out.update(self.fit.to_dict())
        else:
            out["refusal"] = self.refusal
        return out


def group_name(row: Row) -> str:
    """A family, kept apart when its runs were fine-tuned from label-free pretraining (another kind of curve)."""
    return f"{row.family} (label-free pretraining)" if row.label_free else row.family


def evaluation_rows(states: list[RunState], rows: list[Row], metric: str) -> list[Row]:
    """A row for every evaluation of `metric` a finished run logged before its end, at the compute spent by then.

    The compute is the run's own (analytic FLOPs per step are constant: fixed batch) times step / steps, plus its
    pretraining run's when it started from one. Such a point understates what its compute can buy (the learning rate
    had not decayed; Zhai et al. cool down a checkpoint before measuring it), so the front it joins is conservative."""
    by_name = {s.name: s for s in states}
    out = []
    for row in rows:
        state = by_name.get(row.run)
        if state is None or row.exaflops is None or state.exaflops is None or not row.steps:
            continue
        pretraining = row.exaflops - state.exaflops
        for step, value in state.curve(metric, "step"):
            if 0 < step < row.steps:  # the final evaluation is the row itself
                share = step / row.steps
                out.append(dataclasses.replace(
                    row, run=f"{row.run}@{int(step)}", steps=int(step), exaflops=pretraining + state.exaflops * share,
                    epochs=None if row.epochs is None else row.epochs * share, accuracy={metric: 100 * value},
                    pareto=False))
    return out


def check_bootstrap(n_boot: int) -> None:
    """A bootstrap too small for 2.5th/97.5th percentiles is the user's setting, not a family's refusal."""
    if n_boot < 10:
        raise ScalingFitError(f"--bootstrap {n_boot}: the intervals need at least 10 refits (default 200)")


def _fit_group(group: FitGroup, n_boot: int, seed: int) -> FitGroup:
    x = [getattr(r, group.cost) for r in group.points]
    error = [100 - r.accuracy[group.metric] for r in group.points]
    what = f"{group.group} ({group.source})"
    try:
        group.fit = fit_power_law(x, error, n_boot=n_boot, seed=seed, what=what)
    except ScalingFitError as e:
        group.refusal = str(e)
    return group


def compute_fits(rows: list[Row], metric: str, source: str = "sweep", *, n_boot: int = 200,
                 seed: int = 0) -> list[FitGroup]:
    """One fit per family, on that family's own Pareto front of `metric` against exaFLOPs."""
    check_bootstrap(n_boot)
    scored = [r for r in rows if r.exaflops and r.exaflops > 0 and metric in r.accuracy]
    groups = []
    for name in sorted({group_name(r) for r in scored}):
        mine = [r for r in scored if group_name(r) == name]
        on = pareto_frontier([r.exaflops for r in mine], [r.accuracy[metric] for r in mine])
        front = sorted((r for r, o in zip(mine, on) if o), key=lambda r: r.exaflops)
        groups.append(_fit_group(FitGroup(source, name, "exaflops", metric, front), n_boot, seed))
    return groups


def data_size_fits(rows: list[Row], metric: str, *, n_boot: int = 200, seed: int = 0) -> list[FitGroup]:
    """One fit per model of `metric` against training-set size (every run of the model: one per data fraction)."""
    check_bootstrap(n_boot)
    scored = [r for r in rows if r.train_examples and metric in r.accuracy]
    return [_fit_group(FitGroup("sweep", model, "train_examples", metric,
                                sorted((r for r in scored if r.model == model), key=lambda r: r.train_examples)),
                       n_boot, seed)
            for model in sorted({r.model for r in scored})]


def _g(value: float) -> str:
    return format(value, ".4g")


def fits_table(groups: list[FitGroup]) -> tuple[list[str], list[list[str]]]:
    """Header and cells of the fits table (report.md/html): parameters with their intervals, and the fit's quality."""
    header = ["source", "curve", "cost", "points", *PARAMS, "RMSE (log E)", "max |error residual| [points]", "note"]
    cells = []
    for g in groups:
        if g.fit is None:
            cells.append([g.source, g.group, g.cost, str(len(g.points)), *[""] * len(PARAMS), "", "", g.refusal])
            continue
        iv, good = g.fit.intervals(), g.fit.goodness()
        note = f"{good['dof']} degree{'s' if good['dof'] != 1 else ''} of freedom"
        if good["at_upper_bound"]:
            note += f"; {', '.join(good['at_upper_bound'])} at its upper bound: these points stretch the law to its limit"
        cells.append([g.source, g.group, g.cost, str(len(g.points)),
                      *[f"{_g(g.fit.params[k])} [{_g(iv[k][0])}, {_g(iv[k][1])}]" for k in PARAMS],
                      f"{good['rmse_log']:.3g}", f"{good['max_abs_error_points']:.3g}", note])
    return header, cells


def write_scaling(out, groups: list[FitGroup], *, n_boot: int, seed: int) -> list:
    """scaling.json (everything, including the bootstrap refits that `sweep suggest` reads) and scaling.csv (one
    row per curve: each parameter, its interval, the goodness of fit). Returns the two paths."""
    level = next((g.fit.level for g in groups if g.fit), 0.95)
    doc = {"law": LAW, "fit": "least squares on log E, bounded: a >= 0, 0 < b <= 5, 0 <= c <= min E, 0 <= d <= max C",
           "bootstrap": {"kind": "residuals in log space", "draws": n_boot, "seed": seed, "level": level},
           "max_extrapolation": MAX_EXTRAPOLATION, "fits": [g.to_dict() for g in groups]}
    json_path, csv_path = out / SCALING_JSON, out / "scaling.csv"
    json_path.write_text(json.dumps(doc, indent=1) + "\n")
    buf = io.StringIO()
    writer = csv.writer(buf)
    quality = ("points", "dof", "rmse_log", "r2_log", "max_abs_error_points", "at_upper_bound")
    writer.writerow(["source", "curve", "cost", "metric", "status",
                     *[f"{k}{end}" for k in PARAMS for end in ("", "_lo", "_hi")], *quality, "cost_min", "cost_max",
                     "refusal"])
    for g in groups:
        if g.fit is None:
            writer.writerow([g.source, g.group, g.cost, g.metric, "refused", *[""] * (3 * len(PARAMS)), len(g.points),
                             *[""] * (len(quality) - 1), "", "", g.refusal])
            continue
        iv, good = g.fit.intervals(), g.fit.goodness()
        writer.writerow([g.source, g.group, g.cost, g.metric, "fitted",
                         *[repr(v) for k in PARAMS for v in (g.fit.params[k], *iv[k])],
                         *[" ".join(v) if isinstance(v := good[k], list) else v for k in quality], *g.fit.x_range, ""])
    csv_path.write_text(buf.getvalue())
    return [json_path, csv_path]


def load_fits(path) -> list[dict]:
    """The fits of a scaling.json; a one-line error when it is missing or not one."""
    try:
        doc = json.loads(path.read_text())
        return list(doc["fits"])
    except FileNotFoundError:
        raise ScalingFitError(f"{path} does not exist: run `vit-jax sweep report` on the sweep first") from None
    except (json.JSONDecodeError, KeyError, TypeError):
        raise ScalingFitError(f"{path} is not a scaling.json written by `vit-jax sweep report`") from None


def _ef(value: float) -> str:
    """exaFLOPs for reading: 10,000 rather than 1e+04; small sweeps' 4.15e-08 as it is."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.4g}"


def _choose(fits: list[dict], budget: float, family: str | None) -> tuple[dict, PowerLawFit]:
    compute = [f for f in fits if f.get("cost") == "exaflops" and f.get("source") == "sweep"] or \
        [f for f in fits if f.get("cost") == "exaflops"]  # a sweep's own fits, not the paper's beside them
    if family is not None:
        compute = [f for f in compute if f["group"].lower() == family.lower()]
        if not compute:
            known = sorted({f["group"] for f in fits if f.get("cost") == "exaflops"})
            raise ScalingFitError(f"no family {family!r} in the fits (families: {', '.join(known) or 'none'})")
    fitted = [(f, PowerLawFit.from_dict(f)) for f in compute if f["status"] == "fitted"]
    if not fitted:
        reasons = "; ".join(f["refusal"] for f in compute) or "no compute fit in the report"
        raise ScalingFitError(f"no fit to plan with: {reasons}")
    # Without --family: of the fits that speak for the budget, the one promising the lowest error (the best buy).
    speaking = [(f, fit) for f, fit in fitted if _out_of_range(f, fit, budget) is None]
    if len(fitted) == 1 and not speaking:
        raise ScalingFitError(_out_of_range(*fitted[0], budget))
    if not speaking:
        ranges = ", ".join(f"{f['group']} {_ef(fit.x_range[0])}-{_ef(fit.x_range[1])}" for f, fit in fitted)
        raise ScalingFitError(f"no fit speaks for {_ef(budget)} exaFLOPs, more than {MAX_EXTRAPOLATION:g}x outside "
                              f"each one's compute ({ranges} exaFLOPs)")
    return min(speaking, key=lambda pair: float(pair[1].predict(budget)))


def _out_of_range(entry: dict, fit: PowerLawFit, budget: float) -> str | None:
    """Why the fit cannot speak for `budget`, or None when it can."""
    lo, hi = fit.x_range
    if lo / MAX_EXTRAPOLATION <= budget <= MAX_EXTRAPOLATION * hi:
        return None
    return (f"{entry['group']} ({entry['source']}): {_ef(budget)} exaFLOPs is more than {MAX_EXTRAPOLATION:g}x "
            f"outside the fitted compute ({_ef(lo)}-{_ef(hi)} exaFLOPs); the fit does not speak for it")


def suggest(fits: list[dict], budget: float, family: str | None = None) -> str:
    """One line: the error the fit predicts at `budget` exaFLOPs (with its band) and the model and training length
    that reach it most cheaply by the front: the front's run nearest the budget in log compute, trained for
    budget / (its compute per step) steps. The compute per step is the run's analytic FLOPs (summary.json's
    compute.exaflops over its steps), so the steps spend exactly the budget."""
    if not (math.isfinite(budget) and budget > 0):
        raise ScalingFitError(f"--budget-exaflops must be a positive number, not {budget}")
    entry, fit = _choose(fits, budget, family)
    if (why := _out_of_range(entry, fit, budget)) is not None:
        raise ScalingFitError(why)
    lo, hi = fit.x_range
    name = f"{entry['group']} ({entry['source']})"
    pred = float(fit.predict(budget))
    band_lo, band_hi = (float(v[0]) for v in fit.band([budget]))
    where = (f", extrapolated {budget / hi:.3g}x beyond the largest measured {_ef(hi)}" if budget > hi else
             f", below the smallest measured {_ef(lo)}" if budget < lo else "")
    point = min(entry["points"], key=lambda p: abs(math.log(p["exaflops"] / budget)))
    scale = budget / point["exaflops"]
    size = f", {point['params'] / 1e6:.3g}M parameters" if point.get("params") else ""
    if point.get("pretraining"):  # its compute counts its pretraining run's too: steps do not scale with it
        length = f"as run {point['run']} was trained (its compute includes its pretraining)"
    else:
        parts = ([f"{round(point['steps'] * scale):,} steps"] if point.get("steps") else []) + \
                ([f"{point['epochs'] * scale:.3g} epochs"] if point.get("epochs") else [])
        length = f"for {' = '.join(parts)}" if parts else f"at {scale:.3g}x the length of run {point['run']}"
    return (f"{name}, error = {entry['error_definition']}: at {_ef(budget)} exaFLOPs the fit predicts {pred:.2f}% "
            f"[{band_lo:.2f}, {band_hi:.2f}] ({100 * fit.level:.0f}% band{where}); cheapest by the front: "
            f"{point['model']}{size} {length} (the front's model nearest this compute, measured at "
            f"{_ef(point['exaflops'])} exaFLOPs)")


def curve_points(fit: PowerLawFit, extend: float = 3.0, n: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """(measured range, extrapolated range) of costs on a log grid for drawing: the second runs from the largest
    measured cost to `extend` times it (drawn dashed)."""
    lo, hi = fit.x_range
    return np.geomspace(lo, hi, n), np.geomspace(hi, hi * extend, max(n // 3, 2))
