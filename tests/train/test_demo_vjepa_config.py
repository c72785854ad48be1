"""configs/demo_vjepa.py: its three stages validate, V-JEPA pretrains on every training clip without labels, and the
fine-tuned and from-scratch stages differ only in their initialisation: the same model, the same 10% of the labelled
clips and the same recipe and steps (the comparison's premise). Its numbers: docs/video.md (benchmarks/demo_vjepa.sh).
No training: the stages are checked as configs."""

import types

import tensorflow_datasets as tfds

from tests.conftest import ROOT
from vit_jax.data import moving_digits
from vit_jax.train.config import config_module, model_config
from vit_jax.train.objectives.vjepa import VJEPA
from vit_jax.train.stages import stage_configs


def test_pretrain_finetune_and_scratch_share_the_model_and_the_fine_tuning_recipe():
    module = config_module(ROOT / "configs" / "demo_vjepa.py")
    stages = dict(stage_configs(module.get_config("seed=2"), "/runs/vj"))
    assert list(stages) == ["pretrain", "finetune", "scratch"]
    pre, ft, scratch = stages["pretrain"], stages["finetune"], stages["scratch"]
    assert pre.seed == ft.seed == scratch.seed == 2
    assert (pre.objective, ft.objective, scratch.objective) == ("vjepa", "classification", "classification")
    assert pre.eval.evaluators == ("vjepa",)
    assert pre.model.to_dict() == ft.model.to_dict()  # the pretrained encoder is the classifier's
    VJEPA.from_config(pre, model_config(pre, 0))  # the V-JEPA settings and the encoder suit each other

    # the splits: V-JEPA sees all 4,000 training clips (labels unused), both classifiers the same 400
    assert pre.data.train_split == "train" and ft.data.train_split == scratch.data.train_split == "train[:10%]"
    assert moving_digits.SPLITS["train"][1] == module.TRAIN_CLIPS
    sizes = {"train": types.SimpleNamespace(num_examples=module.TRAIN_CLIPS)}
    (labelled,) = tfds.core.ReadInstruction.from_spec(ft.data.train_split).to_absolute(sizes)
    assert (labelled.from_ or 0, labelled.to) == (0, module.LABELLED_CLIPS)
    assert ft.data.eval_split == scratch.data.eval_split == "test"

    # fine-tuning and scratch: one recipe, steps included; only the initialisation differs
    assert ft.init.checkpoint == "/runs/vj/pretrain" and set(ft.init.reinit) == {"head", "predictor"}
    assert not scratch.init.checkpoint
    a, b = ft.to_dict(), scratch.to_dict()
    a.pop("init"), b.pop("init")
    assert a == b
    assert ft.total_epochs == module.FINETUNE_EPOCHS and ft.eval.evaluators == ("classification",)
    assert dict(module.get_config().stage_results) == {"vjepa_finetune_top1": "finetune:eval/top1",
                                                      "scratch_top1": "scratch:eval/top1"}
