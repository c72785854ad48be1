"""The ViT paper's fine-tuning learning-rate grid (Table 4 / Appendix B.1.1) for one dataset and checkpoint.

    vit-jax sweep run configs/sweeps/finetune_lr.py:cifar10,/path/ViT-B_16.npz --root workdirs/ft_cifar10
    vit-jax sweep report workdirs/ft_cifar10 --metric eval/top1

Four fine-tuning runs of configs/finetune.py, one per learning rate of the paper's grid ({0.001, 0.003, 0.01, 0.03};
ImageNet: {0.003, 0.01, 0.03, 0.06}). The paper selects the rate on a held-out 2% of the training split and then
reports the test accuracy of that rate.
"""

import importlib.util
from pathlib import Path


def _finetune_module():
    path = Path(__file__).resolve().parents[1] / "finetune.py"
    spec = importlib.util.spec_from_file_location("finetune_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get_sweep(arg: str = "cifar10,"):
    dataset, _, init = arg.partition(",")
    ft = _finetune_module()
    grid = ft.LR_GRID.get(dataset, ft.DEFAULT_LR_GRID)
    base = f"configs/finetune.py:dataset={dataset}" + (f",init={init}" if init else "")
    return {
        "description": f"fine-tuning learning-rate grid on {dataset} (ViT paper Table 4)",
        "base": base,
        "grid": {"optimizer.lr": list(grid)},
    }
