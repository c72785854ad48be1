"""The compute-versus-accuracy table of a sweep: one row per run (Table 6 of the ViT paper), its Pareto frontier,
and the paper's own points from package data."""

from __future__ import annotations

import csv
import dataclasses
import importlib.resources
import io
import math
import re
from typing import Any, Sequence

from vit_jax.sweep.runs import RunState, is_accuracy, nested_get
from vit_jax.train import objectives
from vit_jax.train.workdir import resolve


def pareto_frontier(costs: Sequence[float], values: Sequence[float]) -> list[bool]:
    """on[i] is True iff no other point has cost <= costs[i] and value >= values[i] with at least one strict.

    Identical points do not dominate each other, so both stay on the frontier.
    """
    n = len(costs)
    assert len(values) == n
    on = []
    for i in range(n):
        dominated = any(costs[j] <= costs[i] and values[j] >= values[i]
                        and (costs[j] < costs[i] or values[j] > values[i]) for j in range(n) if j != i)
        on.append(not dominated)
    return on


@dataclasses.dataclass
class Row:
    """One line of the report table. Accuracies are in percent."""

    source: str  # "sweep" or "paper"
    run: str
    model: str
    family: str  # ViT | Hybrid | ResNet
    epochs: float | None = None
    steps: int | None = None
    params: int | None = None
    exaflops: float | None = None
    device_days: float | None = None
    img_per_sec: float | None = None
    mfu: float | None = None
    train_examples: int | None = None  # size of the training set the run used (after data.fraction)
    # How the run's initial weights were learnt, when they come from another run of the report (init.checkpoint):
    # "supervised" or "label-free (<objective>)"; "" for runs trained from scratch (or from outside weights).
    pretraining: str = ""
    accuracy: dict[str, float] = dataclasses.field(default_factory=dict)
    pareto: bool = False

    @property
    def label_free(self) -> bool:
        return self.pretraining.startswith("label-free")


def family_of(model: str) -> str:
    """Family from a model name, for rows whose summary does not say: R50+ViT-B/16 -> Hybrid, ResNet50x2 -> ResNet."""
    if "+" in model:
        return "Hybrid"
    if model.startswith(("ResNet", "BiT")):
        return "ResNet"
    return "ViT"


def _num(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def device_time_unit(states: list[RunState]) -> tuple[str, str]:
    """(summary compute key, label) of the device-time column: TPUv3-core-days when every run reports them."""
    computes = [(s.summary or {}).get("compute") or {} for s in states]
    if computes and all(_num(c.get("tpu_v3_core_days")) is not None for c in computes):
        return "tpu_v3_core_days", "TPUv3-core-days"
    kinds = sorted({str(c.get("device_kind")) for c in computes if c.get("device_kind")})
    return "device_days", f"device-days ({', '.join(kinds)})" if kinds else "device-days"


def _natural(key: str) -> list:
    """Sort key that puts fewshot/x/5shot before fewshot/x/10shot."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", key)]


def accuracy_keys(states: list[RunState], metric: str,
                  finetuned: dict[str, dict[str, float]] | None = None) -> list[str]:
    """The selected metric first, then every other accuracy reported by any run (eval/*, fewshot/*, finetune/*)."""
    keys: set[str] = {k for accs in (finetuned or {}).values() for k in accs}
    for s in states:
        for k, v in ((s.summary or {}).get("final") or {}).items():
            if _num(v) is not None and is_accuracy(k):
                keys.add(k)
    order = ("eval/", "finetune/", "fewshot/")
    rest = sorted(keys - {metric}, key=lambda k: (next((i for i, p in enumerate(order) if k.startswith(p)), 3),
                                                 _natural(k)))
    return [metric, *rest]


def finetune_accuracy(states: list[RunState], finetune_states: list[RunState],
                      metric: str = "eval/top1") -> dict[str, dict[str, float]]:
    """{pretraining run name: {"finetune/<dataset>/top1": best fraction}} from fine-tuning runs.

    A fine-tuning run belongs to the pretraining run whose workdir its `init.checkpoint` names (the workdir itself,
    its checkpoints/ folder or one step). With several (the learning-rate grid), the best final `metric` is kept:
    the paper picks the rate on held-out training data, so with only a test split this is an optimistic choice.
    """
    by_workdir = {resolve(str(s.workdir).rstrip("/")): s.name for s in states}
    out: dict[str, dict[str, float]] = {}
    for ft in finetune_states:
        init = nested_get(ft.summary, "config", "init", "checkpoint")
        value = ft.metric(metric)
        if not ft.finished or not init or value is None:
            continue
        init = resolve(init.rstrip("/"))
        owner = next((name for wd, name in by_workdir.items() if init == wd or init.startswith(wd + "/")), None)
        if owner is None:
            continue
        key = f"finetune/{nested_get(ft.summary, 'dataset', 'name') or 'unknown'}/{metric.rsplit('/', 1)[-1]}"
        accs = out.setdefault(owner, {})
        accs[key] = max(value, accs.get(key, -math.inf))
    return out


def sweep_rows(states: list[RunState], metric: str, device_key: str = "device_days",
               finetuned: dict[str, dict[str, float]] | None = None) -> list[Row]:
    """Rows of the finished runs, sorted by compute, frontier marked over the runs that have `metric` and compute.

    `finetuned` (finetune_accuracy) adds each run's fine-tuned accuracies as more columns."""
    rows = []
    by_workdir = {resolve(str(s.workdir).rstrip("/")): s for s in states}
    for s in states:
        if not s.finished:
            continue
        summary = s.summary or {}
        exaflops, pretraining = s.exaflops, ""
        if (source := _init_run(summary, by_workdir)) is not None:
            # Started from another run of the report: its compute is part of this result (the paper's compute axis
            # counts pretraining), and what it learnt from says which kind of pretraining this point stands for.
            exaflops = None if exaflops is None or source.exaflops is None else exaflops + source.exaflops
            objective = nested_get(source.summary, "config", "objective") or objectives.DEFAULT_OBJECTIVE
            pretraining = ("supervised" if objective == objectives.DEFAULT_OBJECTIVE else
                           f"label-free ({objective})")
        model = summary.get("model") or {}
        compute = summary.get("compute") or {}
        name = str(model.get("name") or model.get("variant") or s.name)
        accuracy = {k: 100 * v for k in accuracy_keys([s], metric) if (v := s.metric(k)) is not None}
        accuracy.update({k: 100 * v for k, v in (finetuned or {}).get(s.name, {}).items()})
        rows.append(Row(source="sweep", run=s.name, model=name, family=str(model.get("family") or family_of(name)),
                        epochs=_num(summary.get("epochs")), steps=s.steps, params=model.get("params"),
                        exaflops=exaflops, device_days=_num(compute.get(device_key)),
                        img_per_sec=_num(compute.get("img_per_sec")), mfu=_num(compute.get("mfu")),
                        train_examples=nested_get(summary, "dataset", "train_examples"), accuracy=accuracy,
                        pretraining=pretraining))
    mark_frontier(rows, metric)
    return sort_by_compute(rows)


def _init_run(summary: dict, by_workdir: dict[str, RunState]) -> RunState | None:
    """The run of the report whose workdir (or a checkpoint in it) the run's init.checkpoint names."""
    init = nested_get(summary, "config", "init", "checkpoint")
    if not init:
        return None
    init = resolve(str(init).rstrip("/"))
    return next((s for wd, s in by_workdir.items() if init == wd or init.startswith(wd + "/")), None)


def mark_frontier(rows: list[Row], metric: str) -> None:
    """Sets Row.pareto on the rows that have compute and the metric (others are never on the frontier)."""
    scored = [r for r in rows if r.exaflops is not None and metric in r.accuracy]
    for row, on in zip(scored, pareto_frontier([r.exaflops for r in scored], [r.accuracy[metric] for r in scored])):
        row.pareto = on


def sort_by_compute(rows: list[Row]) -> list[Row]:
    """Ascending exaFLOPs; rows without compute last, then by run name."""
    return sorted(rows, key=lambda r: (r.exaflops is None, r.exaflops or 0.0, r.source, r.run))


PAPER_METRIC = "paper: ImageNet top-1 (fine-tuned)"


def paper_rows() -> list[Row]:
    """The ViT paper's Table 6 points (package data vit_jax/resources/vit_table6.csv)."""
    text = importlib.resources.files("vit_jax.resources").joinpath("vit_table6.csv").read_text()
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    rows = []
    for rec in csv.DictReader(io.StringIO("\n".join(lines))):
        model = rec["model"].strip()
        rows.append(Row(source="paper", run="paper", model=model, family=rec["family"].strip(),
                        epochs=float(rec["epochs"]), exaflops=float(rec["pretrain_exaflops"]),
                        accuracy={PAPER_METRIC: float(rec["imagenet_top1"])}))
    return rows
