"""Scaling-law fits: E = a·(C + d)^(−b) + c recovered from noisy synthetic points, refusals in one line, the report's
scaling.json / scaling.csv, and `vit-jax sweep suggest` on a sweep and on the paper's Table 6."""

import csv
import json

import numpy as np
import pytest

from vit_jax.commands import sweep as cli
from vit_jax.report.pareto import PAPER_METRIC, Row, paper_rows
from vit_jax.report.scaling import MIN_POINTS, PARAMS, PowerLawFit, ScalingFitError, fit_power_law, law
from vit_jax.report.scaling_report import compute_fits, evaluation_rows, suggest
from vit_jax.report.sweep_report import write_report
from vit_jax.sweep.runs import read_sweep_root

TRUE = {"a": 30.0, "b": 0.5, "c": 5.0, "d": 2.0}
N_BOOT = 20  # enough for percentiles that hold the truth, few enough for a fast test


def noisy_points(n: int = 10, noise: float = 0.02, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Errors [%] from the true law at n log-spaced costs, with multiplicative noise (the fit works in log E)."""
    x = np.geomspace(1.0, 1000.0, n)
    rng = np.random.default_rng(seed)
    return x, law(x, **TRUE) * np.exp(rng.normal(0.0, noise, n))


def test_fit_recovers_the_law_within_its_bootstrap_intervals():
    x, e = noisy_points()
    fit = fit_power_law(x, e, n_boot=N_BOOT, seed=0)
    intervals = fit.intervals()
    for k in PARAMS:
        lo, hi = intervals[k]
        assert lo <= TRUE[k] <= hi, (k, TRUE[k], intervals[k])
        assert lo <= fit.params[k] <= hi
    good = fit.goodness()
    assert good["points"] == 10 and good["dof"] == 6 and good["r2_log"] > 0.99 and good["rmse_log"] < 0.05
    # The band holds the true curve over the data, and widens where the fit extrapolates.
    xs = np.geomspace(1.0, 1000.0, 7)
    lo, hi = fit.band(xs)
    assert np.all(lo <= law(xs, **TRUE) + 0.05) and np.all(law(xs, **TRUE) - 0.05 <= hi)
    width_in, width_out = (np.diff(fit.band([v]), axis=0).item() for v in (300.0, 10000.0))
    assert width_out > width_in


def test_fit_is_deterministic_and_survives_json():
    x, e = noisy_points()
    first, second = (fit_power_law(x, e, n_boot=N_BOOT, seed=3) for _ in range(2))
    assert first.params == second.params and np.array_equal(first.draws, second.draws)
    again = PowerLawFit.from_dict(json.loads(json.dumps(first.to_dict())))
    assert again.params == first.params and again.intervals() == first.intervals()
    assert np.allclose(again.band([50.0, 5000.0]), first.band([50.0, 5000.0]))


def test_too_few_points_and_bad_values_are_refused_in_one_line():
    x, e = noisy_points(MIN_POINTS - 1)
    with pytest.raises(ScalingFitError) as info:
        fit_power_law(x, e, n_boot=N_BOOT, what="ViT (sweep)")
    assert str(info.value) == "ViT (sweep): 4 points, a fit of E = a*(C + d)^(-b) + c needs at least 5"
    x, e = noisy_points(6)
    for bad_x, bad_e in ((x, np.where(np.arange(6) == 2, 0.0, e)), (np.where(np.arange(6) == 0, -1.0, x), e),
                         (np.full(6, 3.0), e)):
        with pytest.raises(ScalingFitError) as info:
            fit_power_law(bad_x, bad_e, n_boot=N_BOOT)
        assert "\n" not in str(info.value)


def paper_like_rows() -> list[Row]:
    """Seven models of one family on the true law, one off the front (beaten by a cheaper one)."""
    x, e = noisy_points(6, seed=2)
    rows = [Row(source="sweep", run=f"m{i}", model=f"M{i}", family="ViT", steps=100, epochs=5.0, params=10 ** 6 * i,
                exaflops=float(c), accuracy={"eval/top1": 100 - float(err)}) for i, (c, err) in enumerate(zip(x, e))]
    rows.append(Row(source="sweep", run="slow", model="Slow", family="ViT", steps=100, exaflops=500.0,
                    accuracy={"eval/top1": 50.0}))
    rows.append(Row(source="sweep", run="r", model="R", family="ResNet", steps=100, exaflops=5.0,
                    accuracy={"eval/top1": 60.0}))
    return rows


def test_compute_fits_take_each_familys_front_and_refuse_small_families():
    fits = {g.group: g for g in compute_fits(paper_like_rows(), "eval/top1", n_boot=N_BOOT)}
    assert [r.run for r in fits["ViT"].points] == [f"m{i}" for i in range(6)]  # 'slow' is off the front
    assert fits["ViT"].fit is not None
    assert fits["ResNet"].fit is None and fits["ResNet"].refusal.startswith("ResNet (sweep): 1 point, ")


def test_suggest_names_model_and_steps_and_refuses_far_budgets():
    fits = [g.to_dict() for g in compute_fits(paper_like_rows(), "eval/top1", n_boot=N_BOOT)]
    line = suggest(fits, 2000.0, "vit")
    assert "\n" not in line and line.startswith("ViT (sweep), error = 100 - eval/top1 [%]: at 2,000 exaFLOPs")
    # The front's model nearest 2,000 exaFLOPs is the last (1,000 exaFLOPs in 100 steps): twice the steps.
    assert "cheapest by the front: M5, 5M parameters for 200 steps = 10 epochs" in line
    assert "extrapolated 2x beyond the largest measured 1,000" in line
    with pytest.raises(ScalingFitError, match=r"more than 10x outside the fitted compute \(1-1,000 exaFLOPs\)"):
        suggest(fits, 20000.0, "ViT")
    with pytest.raises(ScalingFitError, match="needs at least 5"):
        suggest(fits, 10.0, "ResNet")
    with pytest.raises(ScalingFitError, match=r"no family 'BiT' in the fits \(families: ResNet, ViT\)"):
        suggest(fits, 10.0, "BiT")


def test_suggest_without_family_takes_the_sweeps_fits_that_speak_for_the_budget():
    rows = paper_like_rows()
    # A second fitted family, a million times further along the compute axis, and better there.
    rows += [Row(source="sweep", run=f"h{r.run}", model=f"H{r.model}", family="Hybrid", steps=100,
                 exaflops=r.exaflops * 1e6, accuracy={"eval/top1": r.accuracy["eval/top1"] + 1})
             for r in rows if r.family == "ViT" and r.run != "slow"]
    sweep = [g.to_dict() for g in compute_fits(rows, "eval/top1", n_boot=N_BOOT)]
    paper = [g.to_dict() for g in compute_fits(paper_rows(), PAPER_METRIC, "paper", n_boot=N_BOOT)]
    assert suggest(sweep + paper, 2000.0).startswith("ViT (sweep)")  # the Hybrid fit starts at 1,000,000
    assert suggest(sweep + paper, 1e7).startswith("Hybrid (sweep)")
    # The paper's ViT fit (55-4,262 exaFLOPs) would speak for 20,000; a sweep's report plans with its own fits.
    with pytest.raises(ScalingFitError, match=r"^no fit speaks for 20,000 exaFLOPs, more than 10x outside each "
                                              r"one's compute \(Hybrid 1,000,000-1,000,000,000, ViT 1-1,000 exaFLOPs\)$"):
        suggest(sweep + paper, 20000.0)


def test_suggest_on_the_papers_table6_answers_in_one_line(capsys):
    assert cli.main(["suggest", "--paper", "--budget-exaflops", "10000", "--family", "ViT", "--bootstrap", "20"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert out.startswith("ViT (paper), error = 100 - ImageNet top-1 (fine-tuned) [%]: at 10,000 exaFLOPs")
    assert "cheapest by the front: ViT-H/14 for 32.8 epochs" in out
    predicted = float(out.split("the fit predicts ")[1].split("%")[0])
    assert 10.0 < predicted < 11.92  # below H/14's measured 11.92% error, above the fitted floor's order
    assert cli.main(["suggest", "--paper", "--budget-exaflops", "1e6", "--family", "ViT", "--bootstrap", "20"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "more than 10x outside the fitted compute (55-4,262 exaFLOPs)" in err
    assert cli.main(["suggest", "--paper", "--budget-exaflops", "500", "--family", "Hybrid", "--bootstrap", "20"]) == 2
    assert "Hybrid (paper): 4 points, a fit of" in capsys.readouterr().err


def write_run(root, name: str, exaflops: float, top1: float, family: str = "ViT", steps: int = 100) -> None:
    run = root / name
    run.mkdir(parents=True)
    lines = [{"step": s, "eval/top1": top1 * (0.6 + 0.4 * s / steps)} for s in (steps // 2, steps)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    summary = {"status": "finished", "steps": steps, "epochs": 5.0,
               "model": {"name": name, "family": family, "params": 2_000_000},
               "compute": {"exaflops": exaflops, "device_days": 1.0}, "final": {"eval/top1": top1}}
    (run / "summary.json").write_text(json.dumps(summary))


@pytest.fixture
def law_sweep(tmp_path):
    """Six ViT runs whose final errors follow the law (halfway evaluations fall off the front, but for the cheapest
    run's: nothing is cheaper), one ResNet."""
    root = tmp_path / "sweep"
    x, e = noisy_points(6, seed=4)
    for i, (c, err) in enumerate(zip(x, e)):
        write_run(root, f"vit{i}", float(c), 1 - float(err) / 100)
    write_run(root, "resnet", 3.0, 0.7, family="ResNet")
    return root


def test_evaluation_rows_put_each_logged_evaluation_at_its_compute(law_sweep):
    states, _ = read_sweep_root(law_sweep)
    rows = [Row(source="sweep", run="vit5", model="vit5", family="ViT", steps=100, epochs=5.0, exaflops=1000.0,
                accuracy={"eval/top1": 90.0})]
    (half,) = evaluation_rows(states, rows, "eval/top1")
    assert (half.run, half.steps, half.epochs, half.exaflops) == ("vit5@50", 50, 2.5, 500.0)


def test_report_writes_the_fit_into_json_csv_markdown_and_suggest_reads_it(law_sweep, capsys):
    paths = write_report(str(law_sweep), n_boot=N_BOOT)
    out = law_sweep / "report"
    assert out / "scaling.json" in paths and out / "scaling.png" in paths
    doc = json.loads((out / "scaling.json").read_text())
    fits = {f["group"]: f for f in doc["fits"]}
    vit = fits["ViT"]
    assert vit["status"] == "fitted" and vit["goodness"]["points"] == 7 and len(vit["bootstrap"]) == N_BOOT
    assert [p["run"] for p in vit["points"]] == ["vit0@50", *[f"vit{i}" for i in range(6)]]
    for k in PARAMS:
        assert vit["intervals"][k][0] <= vit["params"][k] <= vit["intervals"][k][1]
    assert fits["ResNet"]["status"] == "refused" and "2 points" in fits["ResNet"]["refusal"]  # final + halfway
    with open(out / "scaling.csv") as f:
        rows = {r["curve"]: r for r in csv.DictReader(f)}
    assert rows["ViT"]["status"] == "fitted" and float(rows["ViT"]["b_lo"]) <= float(rows["ViT"]["b"])
    assert 0 < float(rows["ViT"]["rmse_log"]) < 0.2 and rows["ResNet"]["refusal"].endswith("needs at least 5")
    assert rows["ResNet"]["points"] == "2" and len(rows["ResNet"]) == len(rows["ViT"])
    md = (out / "report.md").read_text()
    assert "## Scaling-law fits" in md and "| sweep | ViT | exaflops | 7 |" in md and "![scaling](scaling.png)" in md
    assert (out / "report.html").read_text().count("data:image/png;base64,") == 3

    assert cli.main(["suggest", str(law_sweep), "--budget-exaflops", "3000"]) == 0
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and "cheapest by the front: vit5, 2M parameters for 300 steps = 15 epochs" in line
    assert cli.main(["suggest", str(law_sweep / "nowhere"), "--budget-exaflops", "3"]) == 2
    assert "run `vit-jax sweep report` on the sweep first" in capsys.readouterr().err
    assert cli.main(["report", str(law_sweep), "--bootstrap", "5"]) == 2
    assert capsys.readouterr().err == ("vit-jax sweep report: error: --bootstrap 5: the intervals need at least 10 "
                                       "refits (default 200)\n")


def test_data_size_sweep_fits_each_model_against_training_examples(tmp_path):
    root = tmp_path / "fractions"
    sizes = np.array([72, 144, 431, 719, 1437])
    for n in sizes:
        err = float(law(n, a=400.0, b=0.7, c=3.0, d=10.0))
        write_run(root, f"frac{n}", 1.0, 1 - err / 100)
        summary = json.loads((root / f"frac{n}" / "summary.json").read_text())
        summary["model"]["name"] = "w128-d4"
        summary["dataset"] = {"train_examples": int(n)}
        (root / f"frac{n}" / "summary.json").write_text(json.dumps(summary))
    write_report(str(root), n_boot=N_BOOT)
    doc = json.loads((root / "report" / "scaling.json").read_text())
    (data,) = [f for f in doc["fits"] if f["cost"] == "train_examples"]
    assert data["group"] == "w128-d4" and data["status"] == "fitted" and data["x_range"] == [72, 1437]
    assert (root / "report" / "data.png").exists()
