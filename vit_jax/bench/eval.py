"""`vit-jax bench eval`: inference throughput of the trainer's own jitted eval step (forward only, eval mode).

The step is `TrainProgram.eval_step` (logits plus the masked loss/top-1/top-5 sums the evaluator accumulates), fed a
synthetic batch already on the devices. FLOPs are the analytic forward FLOPs per image; MFU is taken against the same
peak as `bench train` (on CPU: a 4096^2 fp32 matmul measured in the same process).

    vit-jax bench eval --variant B/16 --batch-size 256 --output eval.json
"""

from __future__ import annotations

import argparse
import sys

from vit_jax import cli_args
from vit_jax.bench import common


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = cli_args.ArgumentParser(prog="vit-jax bench eval", description=__doc__.split("\n\n")[0])
    common.add_model_args(p, batch=64)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    common.setup_jax(args)
    import jax
    import jax.numpy as jnp

    from vit_jax.bench.train import synthetic_batch

    program = common.build(args)
    spec = dict(program.batch_spec(args.batch))
    spec["_mask"] = jax.ShapeDtypeStruct((args.batch,), jnp.bool_, sharding=program.batch_sh)
    if not args.compile_only:
        batch = synthetic_batch(program, args.batch)
        batch["_mask"] = jax.device_put(jnp.ones((args.batch,), jnp.bool_), program.batch_sh)
        params = program.init_eval_view(0)
    abstract_params = program.abstract_eval_view()
    out = {}

    def run_step(compiled) -> None:
        out["sums"] = compiled(params, batch)
        jax.block_until_ready(out["sums"])

    forward = program.flops_per_image / 3.0  # flops_per_image counts a training step as 3 forward passes
    result = common.measure("eval", "vit-jax bench eval", argv, args, program,
                            lambda: program.eval_step.lower(abstract_params, spec), run_step, forward)
    if not args.compile_only:
        result["examples_counted"] = float(out["sums"]["count"])
        common.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
