"""`vit-jax sweep report`: Pareto frontier, table order, the four output files, paper rows, partial sweeps."""

import csv
import json
from pathlib import Path

import pytest

from vit_jax.report.pareto import paper_rows, pareto_frontier, sweep_rows
from vit_jax.report.sweep_figures import data_size_figure, pareto_figure
from vit_jax.report.sweep_report import write_report
from vit_jax.sweep.runs import read_sweep_root
from vit_jax.commands import sweep as cli

# name -> (exaFLOPs, top1, 5-shot, family). Dominated in top1 by construction: 'slow-worse' (more compute than
# 'cheap', less accurate), 'tie-compute-worse' (same compute as 'mid', less accurate), 'same-acc-more-compute'
# (same accuracy as 'mid', more compute). 'mid-twin' is identical to 'mid': neither dominates the other.
# The 5-shot numbers rank differently: 'slow-worse' and 'tie-compute-worse' join that frontier, 'mid' leaves it.
RUNS = {
    "cheap": (1.0, 0.60, 0.30, "ViT"),
    "slow-worse": (2.0, 0.55, 0.50, "ViT"),
    "mid": (3.0, 0.80, 0.60, "Hybrid"),
    "mid-twin": (3.0, 0.80, 0.60, "ViT"),
    "tie-compute-worse": (3.0, 0.70, 0.65, "ViT"),
    "same-acc-more-compute": (5.0, 0.80, 0.60, "Hybrid"),
    "best": (10.0, 0.90, 0.70, "ViT"),
}
FRONTIER = {"cheap", "mid", "mid-twin", "best"}
FEWSHOT_FRONTIER = {"cheap", "slow-worse", "tie-compute-worse", "best"}


def write_run(root: Path, name: str, exaflops: float, top1: float, fewshot: float, family: str,
              status: str = "finished") -> None:
    run = root / name
    run.mkdir(parents=True)
    with open(run / "metrics.jsonl", "w") as f:
        for step in (50, 100):
            f.write(json.dumps({"step": step, "examples_seen": step * 64, "epoch": step / 20,
                                "exaflops": exaflops * step / 100, "eval/top1": top1 * step / 100}) + "\n")
    summary = {"status": status, "model": {"name": f"ViT-{name}", "params": 1234, "family": family},
               "steps": 100, "epochs": 5.0,
               "compute": {"exaflops": exaflops, "device_days": exaflops / 2, "tpu_v3_core_days": None,
                           "device_kind": "cpu", "img_per_sec": 50.0, "mfu": 0.25},
               "final": {"eval/top1": top1, "eval/top5": min(1.0, top1 + 0.1), "eval/loss": 1.0,
                         "fewshot/digits/5shot": fewshot}}
    (run / "summary.json").write_text(json.dumps(summary))


@pytest.fixture
def sweep_root(tmp_path):
    root = tmp_path / "sweep"
    for name, values in RUNS.items():
        write_run(root, name, *values)
    return root


def read_csv(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_frontier_function_on_known_points():
    costs = [v[0] for v in RUNS.values()]
    on = pareto_frontier(costs, [v[1] for v in RUNS.values()])
    assert {name for name, o in zip(RUNS, on) if o} == FRONTIER
    on = pareto_frontier(costs, [v[2] for v in RUNS.values()])
    assert {name for name, o in zip(RUNS, on) if o} == FEWSHOT_FRONTIER
    assert pareto_frontier([], []) == []
    assert pareto_frontier([1.0], [0.0]) == [True]


def test_report_marks_frontier_sorts_by_compute_and_writes_files(sweep_root, capsys):
    assert cli.main(["report", str(sweep_root), "--bootstrap", "10"]) == 0
    out = sweep_root / "report"
    for name in ("pareto.png", "curves.png", "report.md", "report.html", "results.csv"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "data.png").exists()  # one training-set size: no accuracy-against-data figure
    rows = read_csv(out / "results.csv")
    assert {r["run"] for r in rows if r["pareto"] == "*"} == FRONTIER
    flops = [float(r["exaFLOPs"]) for r in rows]
    assert flops == sorted(flops) and len(rows) == len(RUNS)
    best = next(r for r in rows if r["run"] == "best")
    assert best["eval/top1 [%]"] == "90.00" and best["fewshot/digits/5shot [%]"] == "70.00"
    assert best["eval/top5 [%]"] == "100.00"
    assert best["device-days (cpu)"] == "5" and best["MFU"] == "0.250" and best["params"] == "1234"
    assert "eval/loss [%]" not in rows[0]  # losses are not accuracies
    md = (out / "report.md").read_text()
    assert "![pareto](pareto.png)" in md and "| * | sweep | ViT-best |" in md
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3  # figures embedded, the page stands alone


def test_selected_metric_decides_the_frontier(sweep_root):
    assert cli.main(["report", str(sweep_root), "--bootstrap", "10", "--metric", "fewshot/digits/5shot",
                     "--progress", "epochs"]) == 0
    rows = read_csv(sweep_root / "report" / "results.csv")
    assert list(rows[0])[11] == "fewshot/digits/5shot [%]"  # the chosen metric is the first accuracy column
    assert {r["run"] for r in rows if r["pareto"] == "*"} == FEWSHOT_FRONTIER


def test_compare_paper_adds_table6_rows(sweep_root):
    assert cli.main(["report", str(sweep_root), "--bootstrap", "10", "--compare-paper"]) == 0
    rows = read_csv(sweep_root / "report" / "results.csv")
    paper = [r for r in rows if r["source"] == "paper"]
    assert len(paper) == len(paper_rows()) == 18
    assert {r.family for r in paper_rows()} == {"ViT", "ResNet", "Hybrid"}
    h14 = next(r for r in paper if r["model"] == "ViT-H/14")
    assert h14["exaFLOPs"] == "4262" and h14["paper: ImageNet top-1 (fine-tuned) [%]"] == "88.08"
    assert h14["pareto"] == ""  # paper rows are not part of the sweep's frontier
    assert {r["run"] for r in rows if r["pareto"] == "*"} == FRONTIER
    flops = [float(r["exaFLOPs"]) for r in rows]
    assert flops == sorted(flops)
    assert "ViT paper Table 6" in (sweep_root / "report" / "report.md").read_text()


def test_partial_and_missing_runs_are_reported_not_fatal(sweep_root):
    write_run(sweep_root, "still-running", 0.5, 0.99, 0.99, "ViT", status="running")
    broken = sweep_root / "broken"
    broken.mkdir()
    (broken / "metrics.jsonl").write_text('{"step": 10, "eval/top1": 0.5}\n{"step": 2')  # cut short
    (sweep_root / "sweep.json").write_text(json.dumps({"runs": [{"name": "never-started"}, {"name": "cheap"}]}))
    assert cli.main(["report", str(sweep_root), "--bootstrap", "10"]) == 0
    rows = read_csv(sweep_root / "report" / "results.csv")
    assert "still-running" not in {r["run"] for r in rows}  # unfinished: not in the table or the frontier
    assert {r["run"] for r in rows if r["pareto"] == "*"} == FRONTIER
    md = (sweep_root / "report" / "report.md").read_text()
    assert "- still-running: status running, 100 steps so far" in md
    assert "- never-started: status pending" in md
    assert "broken: status started, 10 steps so far; metrics.jsonl line 2 is not valid JSON (skipped)" in md


def test_report_of_missing_root_is_a_clear_error(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path / "nope")]) == 2
    assert "vit-jax sweep run" in capsys.readouterr().err


def test_device_time_column_is_tpu_core_days_when_every_run_reports_them(sweep_root):
    for summary_path in sweep_root.glob("*/summary.json"):
        summary = json.loads(summary_path.read_text())
        summary["compute"]["tpu_v3_core_days"] = summary["compute"]["exaflops"] * 3
        summary_path.write_text(json.dumps(summary))
    assert cli.main(["report", str(sweep_root), "--bootstrap", "10"]) == 0
    rows = read_csv(sweep_root / "report" / "results.csv")
    assert next(r for r in rows if r["run"] == "best")["TPUv3-core-days"] == "30"


def test_trainer_metric_spelling_eval_lines_without_progress(tmp_path):
    """The trainer logs progress as progress/* and compute/* on train lines only; eval lines carry just the step.
    Curves interpolate progress by step; counts are not accuracies."""
    from vit_jax.sweep.runs import read_run

    run = tmp_path / "r"
    run.mkdir()
    lines = [{"step": 30, "eval/top1": 0.3, "eval/count": 360.0},
             {"step": 50, "train/loss": 1.0, "progress/examples_seen": 6400.0, "progress/epoch": 4.0,
              "compute/exaflops": 2e-8},
             {"step": 60, "eval/top1": 0.5, "eval/count": 360.0}]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    state = read_run(run)
    assert state.curve("eval/top1", "examples_seen") == [(3840.0, 0.3), (7680.0, 0.5)]
    assert state.curve("eval/top1", "epoch") == [(2.4, 0.3), (pytest.approx(4.8), 0.5)]
    assert state.exaflops == 2e-8 and state.steps == 60
    (run / "summary.json").write_text(json.dumps({
        "status": "finished", "steps": 60, "epochs": 4.8, "examples_seen": 7680, "model": {"name": "ViT-x"},
        "compute": {"exaflops": 2.4e-8}, "final": {"eval/top1": 0.5, "eval/prec1": 0.5, "eval/count": 360.0}}))
    assert cli.main(["report", str(tmp_path), "--progress", "epochs"]) == 0
    header = read_csv(tmp_path / "report" / "results.csv")[0]
    assert "eval/prec1 [%]" in header and "eval/count [%]" not in header


def write_finetune_run(root: Path, name: str, init: str, top1: float, dataset: str = "cifar10") -> None:
    run = root / name
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({
        "status": "finished", "model": {"name": "ViT-ft", "family": "ViT"}, "steps": 10, "dataset": {"name": dataset},
        "compute": {"exaflops": 0.01}, "final": {"eval/top1": top1},
        "config": {"init": {"checkpoint": init}}}))


def test_finetuned_accuracy_is_plotted_against_pretraining_compute(sweep_root, tmp_path):
    ft = tmp_path / "ft"
    # Fine-tuned top-1 per pretraining run, best of its learning-rate grid: this ranking makes 'slow-worse' beat
    # 'cheap' and 'mid' (so both leave that frontier), while 'best' stays on it.
    grid = {"cheap": (0.70, 0.72), "slow-worse": (0.91, 0.90), "mid": (0.85,), "best": (0.95, 0.97, 0.96)}
    for run, values in grid.items():
        for i, top1 in enumerate(values):
            # init may name the workdir, its checkpoints folder or one step folder
            init = str(sweep_root / run) + ("", "/checkpoints", "/checkpoints/100")[i]
            write_finetune_run(ft, f"{run},lr{i}", init, top1)
    write_finetune_run(ft, "from-an-npz", "/data/ViT-B_16.npz", 0.99)  # not from this sweep: ignored
    assert cli.main(["report", str(sweep_root), "--bootstrap", "10", "--finetune-root", str(ft),
                     "--metric", "finetune/cifar10/top1"]) == 0
    rows = {r["run"]: r for r in read_csv(sweep_root / "report" / "results.csv")}
    column = "finetune/cifar10/top1 [%]"
    assert {name: rows[name][column] for name in grid} == {"cheap": "72.00", "slow-worse": "91.00", "mid": "85.00",
                                                            "best": "97.00"}
    assert rows["mid-twin"][column] == ""  # never fine-tuned
    assert {r for r in rows if rows[r]["pareto"] == "*"} == {"cheap", "slow-worse", "best"}
    assert list(rows["cheap"])[11] == column  # the selected metric is the first accuracy column


def test_a_finetune_root_that_matches_no_run_is_reported(sweep_root, tmp_path):
    ft = tmp_path / "ft"
    write_finetune_run(ft, "elsewhere", "/data/other/run", 0.9)
    assert cli.main(["report", str(sweep_root), "--bootstrap", "10", "--finetune-root", str(ft)]) == 0
    md = (sweep_root / "report" / "report.md").read_text()
    assert "no finished fine-tuning run in" in md and "starts from a run of" in md


def test_pareto_chart_colours_the_three_families_as_figure_5_and_swin_as_its_own(tmp_path):
    root = tmp_path / "families"
    for name, family, exaflops, top1 in (("vit", "ViT", 1.0, 0.7), ("bit", "ResNet", 2.0, 0.6),
                                         ("hybrid", "Hybrid", 3.0, 0.8), ("bit-big", "ResNet", 4.0, 0.75),
                                         ("swin", "Swin", 2.5, 0.65)):
        write_run(root, name, exaflops, top1, 0.5, family)
    states, _ = read_sweep_root(root)
    fig = pareto_figure(sweep_rows(states, "eval/top1"), "eval/top1", "device-days", tmp_path / "p.png", paper_rows())
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    families = ["Hybrid", "ResNet (BiT)", "Swin", "Transformer (ViT)"]
    assert [label for label in labels if label in families] == families
    assert sorted(label for label in labels if label.startswith("paper Table 6: ")) == \
        [f"paper Table 6: {f}" for f in families if f != "Swin"]  # the paper has no Swin
    # Our runs: one filled collection per family, four distinct colours; the paper's 18 rows: hollow markers.
    filled = {tuple(c.get_facecolor()[0]) for c in ax.collections if c.get_label() in families}
    assert len(filled) == 4
    # A Swin run's summary says its family as the trainer writes it (the family seam's report label).
    from vit_jax.models.family import family_of
    from vit_jax.models.swin_config import swin_config

    assert family_of(swin_config("Swin-32-2-2", num_classes=10, image_size=16, patch_size=2,
                                 window_size=4)).label(None) == "Swin"
    hollow = [c for c in ax.collections if c.get_label().startswith("paper Table 6")]
    assert len(hollow) == len(paper_rows()) == 18
    assert len({tuple(c.get_edgecolor()[0]) for c in hollow}) == 3


def test_data_size_sweep_gets_accuracy_against_training_set_size(tmp_path):
    root = tmp_path / "fractions"
    for model, family, accs in (("vit", "ViT", (0.3, 0.6, 0.9)), ("bit", "ResNet", (0.8, 0.85, 0.95))):
        for examples, top1 in zip((144, 431, 1437), accs):
            name = f"{model}-{examples}"
            write_run(root, name, 1.0, top1, 0.5, family)
            summary_path = root / name / "summary.json"
            summary = json.loads(summary_path.read_text())
            summary["model"]["name"] = model
            summary["dataset"] = {"name": "digits", "train_examples": examples}
            summary_path.write_text(json.dumps(summary))
    paths = write_report(str(root))
    assert (root / "report" / "data.png") in paths and (root / "report" / "data.png").stat().st_size > 0
    assert "![data](data.png)" in (root / "report" / "report.md").read_text()
    # pareto, scaling (the fits), curves and data
    assert (root / "report" / "report.html").read_text().count("data:image/png;base64,") == 4
    states, _ = read_sweep_root(root)
    fig = data_size_figure(sweep_rows(states, "eval/top1"), "eval/top1", tmp_path / "d.png")
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert sorted(lines) == ["bit (ResNet (BiT))", "vit (Transformer (ViT))"]
    assert list(lines["vit (Transformer (ViT))"].get_xdata()) == [144, 431, 1437]
    assert list(lines["bit (ResNet (BiT))"].get_ydata()) == pytest.approx([80.0, 85.0, 95.0])
    assert paths[-5:] == [root / "report" / f
                          for f in ("report.md", "report.html", "results.csv", "scaling.json", "scaling.csv")]


def write_recipe(root: Path) -> Path:
    """A finished multi-stage run (train/stages.py) as configs/demo_ssl.py leaves it: MAE pretraining, a fine-tune
    from it, and a from-scratch control with the compute of both."""
    for stage, exaflops, top1, objective in (("pretrain", 3.0, None, "mae"), ("finetune", 1.0, 0.9, "classification"),
                                             ("scratch", 4.0, 0.8, "classification")):
        write_run(root, stage, exaflops, top1 or 0.0, 0.5, "ViT")
        summary = json.loads((root / stage / "summary.json").read_text())
        summary["config"] = {"objective": objective,
                             "init": {"checkpoint": str(root / "pretrain") if stage == "finetune" else ""}}
        if top1 is None:
            summary["final"] = {"eval/reconstruction_loss": 0.3}
        (root / stage / "summary.json").write_text(json.dumps(summary))
    (root / "summary.json").write_text(json.dumps({"status": "finished", "stages": {
        "pretrain": {}, "finetune": {}, "scratch": {}}, "ssl_finetune_top1": 0.9, "scratch_top1": 0.8}))
    return root


def test_a_multi_stage_run_reports_label_free_and_supervised_points_at_their_whole_compute(tmp_path):
    # The report of the recipe's own workdir and of a sweep root holding it: the fine-tune stands at the compute of
    # pretraining plus fine-tuning, marked label-free, beside the supervised control.
    recipe = write_recipe(tmp_path / "sweep" / "ssl")
    for root, prefix in ((recipe, "ssl/"), (tmp_path / "sweep", "ssl/")):
        states, _ = read_sweep_root(root)
        assert [s.name for s in states] == [f"{prefix}pretrain", f"{prefix}finetune", f"{prefix}scratch"]
        rows = {r.run: r for r in sweep_rows(states, "eval/top1")}
        ft, scratch = rows[f"{prefix}finetune"], rows[f"{prefix}scratch"]
        assert (ft.exaflops, ft.pretraining, ft.label_free) == (4.0, "label-free (mae)", True)
        assert (scratch.exaflops, scratch.pretraining, scratch.label_free) == (4.0, "", False)
    assert cli.main(["report", str(recipe)]) == 0
    csv_rows = {r["run"]: r for r in read_csv(recipe / "report" / "results.csv")}
    assert csv_rows["ssl/finetune"]["pretraining"] == "label-free (mae)" and csv_rows["ssl/scratch"]["pretraining"] == ""
    fig = pareto_figure(sweep_rows(read_sweep_root(recipe)[0], "eval/top1"), "eval/top1", "device-days",
                        tmp_path / "p.png")
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert "Transformer (ViT)" in labels and "Transformer (ViT), label-free pretraining + fine-tuning" in labels
