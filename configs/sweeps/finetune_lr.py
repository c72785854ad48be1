"""The ViT paper's fine-tuning learning-rate grid (Table 4 / Appendix B.1.1) for one dataset and checkpoint, or for
every finished run of a pretraining sweep.

    vit-jax sweep run configs/sweeps/finetune_lr.py:cifar10,/path/ViT-B_16.npz --root workdirs/ft_cifar10
    vit-jax sweep report workdirs/ft_cifar10 --metric eval/top1

    # Fine-tuned accuracy against pretraining compute (the paper's Fig. 5 / Table 6): fine-tune every run of a
    # pretraining sweep root, then report the pretraining sweep with the fine-tuning root attached.
    vit-jax sweep run configs/sweeps/finetune_lr.py:cifar10,gs://B/sweeps/paper_scaling --root gs://B/sweeps/ft_c10
    vit-jax sweep report gs://B/sweeps/paper_scaling --finetune-root gs://B/sweeps/ft_c10 \
        --metric finetune/cifar10/top1

Four fine-tuning runs of configs/finetune.py per checkpoint, one per learning rate of the paper's grid ({0.001,
0.003, 0.01, 0.03}; ImageNet: {0.003, 0.01, 0.03, 0.06}). The paper selects the rate on a held-out 2% of the
training split and then reports the test accuracy of that rate; the report keeps the best of the grid.

A checkpoint argument that is a sweep root (a directory with sweep.json) expands to every run there that has
finished (summary.json), each fine-tuned with its own variant; runs not finished yet are picked up by running this
sweep again later (finished fine-tuning runs are skipped).
"""

from pathlib import Path


def _finetune_module():
    from vit_jax.train.config import config_module

    return config_module(Path(__file__).resolve().parents[1] / "finetune.py")


def pretrained_runs(root: str) -> dict[str, dict[str, str]]:
    """{run name: overrides} for the finished runs of a pretraining sweep root: its checkpoint and variant."""
    from vit_jax.sweep.runs import read_sweep_root

    runs = {}
    for state in sorted(read_sweep_root(root)[0], key=lambda s: s.name):
        if not state.finished:
            continue
        variant = (state.summary.get("model") or {}).get("variant")
        if not variant:
            raise ValueError(f"{state.workdir}: the run has no model variant (a custom size); fine-tune it with "
                             "configs/finetune.py and --config.model.* overrides instead")
        # Overrides, not config arguments: run names contain commas, and finetune.py derives nothing from these.
        runs[state.name] = {"model.variant": variant, "init.checkpoint": str(state.workdir)}
    if not runs:
        raise ValueError(f"{root} holds no finished run (summary.json) to fine-tune yet")
    return runs


def get_sweep(arg: str = "cifar10,"):
    dataset, _, init = arg.partition(",")
    ft = _finetune_module()
    grid = ft.LR_GRID.get(dataset, ft.DEFAULT_LR_GRID)
    sweep = {
        "description": f"fine-tuning learning-rate grid on {dataset} (ViT paper Table 4)",
        "base": f"configs/finetune.py:dataset={dataset}",
        "grid": {"optimizer.lr": list(grid)},
    }
    from vit_jax.sweep.runs import MANIFEST, as_path
    from vit_jax.train.workdir import resolve

    if init and (as_path(resolve(init)) / MANIFEST).exists():  # a pretraining sweep root
        sweep["runs"] = pretrained_runs(resolve(init))  # labelled by the pretraining run's name
    elif init:
        sweep["base"] += f",init={init}"
    return sweep
