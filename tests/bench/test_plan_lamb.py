"""`vit-jax plan` and `vit-jax bench train` take every optimizer the trainer has (lamb included)."""

from vit_jax.bench import plan, train as bench_train
from vit_jax.train.config import ConfigError, default_config, validate


def test_the_commands_offer_the_trainers_optimizers():
    trainer_names = []
    for name in ("adamw", "sgd", "adafactor", "lamb", "adam"):
        c = default_config()
        c.optimizer.name, c.total_steps = name, 1
        try:
            validate(c)
            trainer_names.append(name)
        except ConfigError:
            pass
    assert trainer_names == ["adamw", "sgd", "adafactor", "lamb"]
    for name in trainer_names:
        assert plan.parse_args(["--optimizer", name])[0].optimizer == name
        assert bench_train.parse_args(["--optimizer", name]).optimizer == name

