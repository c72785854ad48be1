"""configs/demo_dino.py: its four stages validate, MAE and DINO pretrain the same encoder for equal training FLOPs
(the issue's comparison's premise), and the from-scratch control trains for the FLOPs of DINO and fine-tuning
together. Its numbers: docs/ssl.md; benchmarks/demo_dino.sh asserts them."""

import pytest

from tests.conftest import ROOT
from vit_jax.models.build import model_flops
from vit_jax.models.flops import mae_flops
from vit_jax.models.mae import MAEConfig
from vit_jax.train.config import config_module, model_config
from vit_jax.train.objectives.dino import Dino, DinoConfig
from vit_jax.train.stages import stage_configs


def test_mae_and_dino_pretrain_for_equal_compute_and_the_control_matches_dino_plus_finetuning():
    module = config_module(ROOT / "configs" / "demo_dino.py")
    stages = dict(stage_configs(module.get_config("seed=2"), "/runs/dino"))
    assert list(stages) == ["mae", "dino", "finetune", "scratch"]
    mae, dino, ft, scratch = (stages[k] for k in ("mae", "dino", "finetune", "scratch"))
    assert mae.objective == "mae" and dino.objective == "dino" and mae.seed == dino.seed == scratch.seed == 2
    assert ft.init.checkpoint == "/runs/dino/dino" and not scratch.init.checkpoint
    # One encoder for every stage; DINO's student alone trains with stochastic depth (a regulariser, no weights).
    arch = [{k: v for k, v in s.model.to_dict().items() if k != "drop_path"} for s in (mae, dino, ft, scratch)]
    assert arch[0] == arch[1] == arch[2] == arch[3] and dino.model.drop_path == 0.1 and ft.model.drop_path == 0.0
    assert "fewshot" in mae.eval.evaluators and "fewshot" in dino.eval.evaluators and dino.eval.fewshot.knn == (10, 20)
    n = module.TRAIN_EXAMPLES
    mae_spent = mae.total_epochs * n * mae_flops(model_config(mae, 0), MAEConfig(**mae.mae)).train
    dino_flops = Dino(model_config(dino, 0), DinoConfig(**dino.dino)).flops.train
    assert dino.total_epochs * n * dino_flops == pytest.approx(mae_spent, rel=2e-3)
    cls = model_flops(model_config(ft, module.NUM_CLASSES)).train
    spent = dino.total_epochs * n * dino_flops + ft.total_epochs * module.LABELLED_EXAMPLES * cls
    assert scratch.total_epochs * module.LABELLED_EXAMPLES * cls == pytest.approx(spent, rel=1e-3)
    assert [s[0] for s in stage_configs(module.get_config("mae=0"), "/r")] == ["dino", "finetune", "scratch"]
