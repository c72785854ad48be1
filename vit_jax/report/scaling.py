"""Saturating power-law fits of error against a cost, E = a·(C + d)^(−b) + c, with bootstrap confidence bands.

The law is Zhai et al. 2022's ("Scaling Vision Transformers"): error falls as a power of compute C, shifted by d
(small models do better than a pure power law at tiny compute) and saturating at c (the error no compute removes).
The fit is least squares on log E: errors span an order of magnitude along a front, and the relative misfit is what
matters at every scale. The same law serves training-set size as the cost (the data-fraction sweep).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
from scipy.optimize import least_squares

from vit_jax.errors import UserError

PARAMS = ("a", "b", "c", "d")
# Four parameters: a fit needs more points than that, or it interpolates and its residuals say nothing about the
# noise that the bootstrap resamples.
MIN_POINTS = len(PARAMS) + 1
LAW = "E = a*(C + d)^(-b) + c"
B_MAX = 5.0  # steeper than error ~ C^-5 is no scaling law any sweep has shown; the bound keeps the search finite


class ScalingFitError(UserError, ValueError):
    """A fit that cannot be made (too few points, an error of 0, a cost that is not positive) or a prediction that
    would be meaningless (a cost far outside the data)."""


@dataclasses.dataclass
class PowerLawFit:
    """A fitted law; `draws` are the bootstrap refits (n_boot, 4) behind every interval and band."""

    a: float
    b: float
    c: float
    d: float
    x: np.ndarray  # the costs fitted (exaFLOPs or examples)
    error: np.ndarray  # the errors fitted [%]
    draws: np.ndarray
    level: float = 0.95

    @property
    def params(self) -> dict[str, float]:
        return {k: float(getattr(self, k)) for k in PARAMS}

    @property
    def x_range(self) -> tuple[float, float]:
        return float(self.x.min()), float(self.x.max())

    def predict(self, x) -> np.ndarray:
        return law(np.asarray(x, float), self.a, self.b, self.c, self.d)

    def band(self, x) -> tuple[np.ndarray, np.ndarray]:
        """The pointwise confidence band of the fitted curve at `x` (percentiles of the bootstrap curves)."""
        x = np.asarray(x, float)
        curves = np.stack([law(x, *draw) for draw in self.draws])
        tail = 100 * (1 - self.level) / 2
        return np.percentile(curves, tail, axis=0), np.percentile(curves, 100 - tail, axis=0)

    def intervals(self) -> dict[str, tuple[float, float]]:
        tail = 100 * (1 - self.level) / 2
        return {k: (float(np.percentile(self.draws[:, i], tail)), float(np.percentile(self.draws[:, i], 100 - tail)))
                for i, k in enumerate(PARAMS)}

    def at_upper_bound(self) -> list[str]:
        """Parameters the optimiser pushed onto their upper bound: the law bent as far as allowed and still short of
        the points (b = 5: a drop steeper than any scaling law; c = min E: a floor at the best point; d = max C).
        The lower bounds (c = 0, d = 0) are ordinary answers: no floor, no shift."""
        bounds = {"b": B_MAX, "c": float(self.error.min()), "d": float(self.x.max())}
        return [k for k, bound in bounds.items() if getattr(self, k) >= bound * (1 - 1e-6)]

    def goodness(self) -> dict[str, float]:
        """Residuals in the space of the fit (log E) and, for reading, in error points."""
        log_res = np.log(self.error) - np.log(self.predict(self.x))
        spread = np.sum((np.log(self.error) - np.log(self.error).mean()) ** 2)
        return {"points": int(self.x.size), "dof": int(self.x.size - len(PARAMS)),
                "rmse_log": float(np.sqrt(np.mean(log_res ** 2))),
                "r2_log": float(1 - np.sum(log_res ** 2) / spread) if spread > 0 else float("nan"),
                "max_abs_error_points": float(np.max(np.abs(self.error - self.predict(self.x)))),
                "at_upper_bound": self.at_upper_bound()}

    def to_dict(self) -> dict:
        return {"params": self.params, "intervals": {k: list(v) for k, v in self.intervals().items()},
                "goodness": self.goodness(), "level": self.level, "x_range": list(self.x_range),
                "x": self.x.tolist(), "error": self.error.tolist(), "bootstrap": self.draws.tolist()}

    @classmethod
    def from_dict(cls, data: dict) -> PowerLawFit:
        p = data["params"]
        return cls(a=p["a"], b=p["b"], c=p["c"], d=p["d"], x=np.asarray(data["x"], float),
                   error=np.asarray(data["error"], float), draws=np.asarray(data["bootstrap"], float).reshape(-1, 4),
                   level=float(data.get("level", 0.95)))


def law(x, a, b, c, d):
    """E(x) = a·(x + d)^(−b) + c."""
    return a * np.power(np.asarray(x, float) + d, -b) + c


def _solve(u: np.ndarray, log_e: np.ndarray, starts: list[np.ndarray], upper: np.ndarray) -> np.ndarray:
    """Best least-squares solution on log E over several starts, in scaled units (u = x / x_max, so d' ≤ 1)."""

    def residuals(theta):
        a, b, c, d = theta
        return np.log(a * np.power(u + d, -b) + c) - log_e

    def jacobian(theta):  # analytic: a finite-difference one costs four more evaluations per step
        a, b, c, d = theta
        g = np.power(u + d, -b)
        f = a * g + c
        return np.stack([g / f, -a * g * np.log(u + d) / f, 1 / f, -a * b * g / (u + d) / f], axis=1)

    lower = np.array([1e-12, 1e-3, 0.0, 0.0])
    best = None
    for start in starts:
        start = np.clip(start, lower, upper)
        result = least_squares(residuals, start, jac=jacobian, bounds=(lower, upper), x_scale="jac", method="trf")
        if best is None or result.cost < best.cost:
            best = result
    a, b, c, d = best.x
    # A floor or shift the optimiser left a hair above its bound of 0 is 0 (6.8e-17 would read as a finding).
    c = 0.0 if c < 1e-9 * float(np.exp(log_e).max()) else c
    d = 0.0 if d < 1e-9 else d
    return np.array([a, b, c, d])


def _starts(u: np.ndarray, e: np.ndarray, c_max: float) -> list[np.ndarray]:
    """A small grid of starts: the law is non-convex in (b, c), and one start can stall on a bound."""
    starts = []
    d = 0.3 * float(u.min())  # inside the bounds, where the gradient in d is not zero
    for b in (0.1, 0.4, 1.0):
        for c in (0.0, 0.8 * c_max):
            # a from the point with the largest cost, so that the start passes through it.
            a = max(float(e[np.argmax(u)]) - c, 1e-6) * (1.0 + d) ** b
            starts.append(np.array([a, b, c, d]))
    return starts


def fit_power_law(x: Sequence[float], error: Sequence[float], *, n_boot: int = 200, seed: int = 0,
                  level: float = 0.95, what: str = "the fit") -> PowerLawFit:
    """Fits E = a·(x + d)^(−b) + c to (x, error) with a ≥ 0, 0 < b ≤ 5, 0 ≤ c ≤ min(error), 0 ≤ d ≤ max(x).

    The bounds say what the law means: c is an error floor below every measured error, d a shift no larger than the
    data (beyond it the shift is not identifiable). Intervals come from a residual bootstrap in log space: with as
    few points as a front has (5-10), resampling the points themselves would mostly draw sets with fewer distinct
    costs than parameters; resampling residuals keeps every cost and varies the noise, which is the uncertainty a
    front carries. Residuals are inflated by sqrt(n / (n - 4)) for the degrees of freedom the fit used. `seed` makes
    the bands reproducible. `what` names the data in error messages.
    """
    x, e = np.asarray(x, float), np.asarray(error, float)
    if n_boot < 10:
        raise ScalingFitError(f"the bootstrap needs at least 10 refits for its percentiles, not {n_boot}")
    if x.size < MIN_POINTS:
        raise ScalingFitError(f"{what}: {x.size} point{'s' if x.size != 1 else ''}, a fit of {LAW} needs at least "
                              f"{MIN_POINTS}")
    if np.any(~np.isfinite(x)) or np.any(x <= 0):
        raise ScalingFitError(f"{what}: every cost must be a positive number")
    if np.any(~np.isfinite(e)) or np.any(e <= 0) or np.any(e >= 100):
        raise ScalingFitError(f"{what}: every error must lie strictly between 0 and 100% (log space)")
    if np.unique(x).size < MIN_POINTS - 1:
        raise ScalingFitError(f"{what}: {np.unique(x).size} distinct costs, the fit needs at least "
                              f"{MIN_POINTS - 1}")
    scale = float(x.max())
    u = x / scale
    # a ≤ 1e3 x (largest error) x (smallest u)^b_max: enough to reach any error at the smallest cost.
    upper = np.array([1e3 * float(e.max()) * float(u.min()) ** -B_MAX, B_MAX, float(e.min()), 1.0])
    theta = _solve(u, np.log(e), _starts(u, e, float(e.min())), upper)

    fitted = np.log(law(u, *theta))
    res = (np.log(e) - fitted) * np.sqrt(e.size / (e.size - len(PARAMS)))
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(n_boot):
        log_e = fitted + rng.choice(res, size=res.size, replace=True)
        # The floor c stays below the resampled errors, as for the point estimate.
        boot_upper = upper.copy()
        boot_upper[2] = float(np.exp(log_e).min())
        # The resampled data lie near the fitted curve: the point estimate is the start that finds their optimum.
        draws.append(_solve(u, log_e, [theta], boot_upper))

    def original(t):  # back to the caller's units: a·(x/s + d')^(−b) = a·s^b·(x + d'·s)^(−b)
        a, b, c, d = t
        return np.array([a * scale ** b, b, c, d * scale])

    return PowerLawFit(*original(theta), x=x, error=e, draws=np.array([original(t) for t in draws]), level=level)
