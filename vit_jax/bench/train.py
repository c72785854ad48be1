"""`vit-jax bench train`: the trainer's own jitted train step (forward, backward, optimizer update), timed.

The step is built by `vit_jax.train.program.build_program`, exactly as the trainer builds it, and fed a synthetic batch
that already lives on the devices, so the numbers are the step alone (no input pipeline, no host transfer). Reports
the median step time after warm-up, images/s, achieved TFLOP/s from the analytic FLOPs (3x forward), MFU, compile time
and peak memory (XLA's memory analysis of the compiled step; the runtime's counters where the backend has them).

    vit-jax bench train --variant S/16 --batch-size 32 --steps 10 --output out.json
    vit-jax bench train --variant B/16 --batch-size 1024 --dtype bfloat16 --output b16.json      # on a GPU/TPU
    vit-jax bench train --variant S/16 --batch-size 32 --mesh 1,1,1 --compare timm --compare big_vision

--compare PEER times another framework's same step (bench/peers.py) interleaved with ours and reports our speed relative
to it; a peer that is not installed is reported as such. Each peer runs in a process of its own, as its users run it
(--peer-process shared: in this one, where it shares vit_jax's process tuning).
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Any

from vit_jax import cli_args
from vit_jax.bench import common, peers


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = cli_args.ArgumentParser(prog="vit-jax bench train", description=__doc__.split("\n\n")[0])
    common.add_model_args(p, batch=32)
    p.add_argument("--optimizer", default="adamw", choices=("adamw", "sgd", "adafactor", "lamb"))
    p.add_argument("--mu-dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--micro-batches", type=int, default=1)
    p.add_argument("--compare", action="append", default=[], choices=sorted(peers.PEERS),
                   help="also time this framework's same step, interleaved (repeatable; not a dependency)")
    p.add_argument("--peer-process", choices=("own", "shared"), default="own",
                   help="own: each peer in a process of its own, with its framework's defaults; shared: in this "
                        "process, with vit_jax's malloc and dispatch settings")
    p.add_argument("--config", default="", help="time a trainer config's step instead of the model flags (FILE.py"
                   "[:ARGS], plus --config.KEY=VALUE overrides): any objective and model family, its batch size, "
                   "mesh and dtype")
    p.add_argument("--stage", default="", help="with --config: this stage of a multi-stage config")
    args, rest = p.parse_known_args(argv)
    args.overrides = [a for a in rest if a.startswith("--config.")]
    if len(args.overrides) != len(rest):
        p.error(f"unrecognized arguments: {' '.join(a for a in rest if a not in args.overrides)}")
    if (args.overrides or args.stage) and not args.config:
        p.error("--config.KEY=VALUE overrides and --stage need --config FILE.py")
    return args


def synthetic_batch(program, batch_size: int, seed: int = 0) -> dict[str, Any]:
    """A random batch of the program's objective (its batch spec: for a classifier, images uniform in [-1, 1] with
    random one-hot labels), generated directly into the batch sharding."""
    import functools

    import jax

    make = functools.partial(program.objective.synthetic_batch, batch_size=batch_size)
    return jax.jit(make, out_shardings=program.batch_sh)(jax.random.key(seed))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    common.setup_jax(args)
    import jax

    if args.config:  # a trainer config: its objective, model, batch size, mesh and dtype, as `plan --config` reads it
        from vit_jax.bench import plan_spec

        spec = plan_spec.resolve({"config": args.config, "overrides": args.overrides, "stage": args.stage},
                                 jax.device_count())
        program = plan_spec.build(spec)
        args.batch, args.dtype, args.num_classes, args.mesh = (spec["batch"], spec["dtype"], spec["num_classes"],
                                                               spec["mesh"])
    else:
        program = common.build(args, optimizer=args.optimizer, mu_dtype=args.mu_dtype,
                               micro_batches=args.micro_batches)
    if args.compare and (program.mesh.size != 1 or args.optimizer != "adamw" or args.dtype != "float32"):
        raise SystemExit("--compare times the peers' fp32 AdamW step on one device: use --mesh 1,1,1 --optimizer adamw "
                         "--dtype float32")
    compared, unavailable = [], {}
    for name in dict.fromkeys([] if args.compile_only else args.compare):
        try:
            factory = peers.PEERS[name]
            build = functools.partial(peers.own_process, factory) if args.peer_process == "own" else factory
            compared.append(build(program.model_cfg, program.config.optimizer, args.batch))
        except peers.PeerUnavailable as e:
            unavailable[name] = str(e)
    spec = program.batch_spec(args.batch)
    box = {"loss": None}
    if not args.compile_only:
        batch = synthetic_batch(program, args.batch)
        box["state"] = program.init_state(0)

    def run_step(compiled) -> None:
        box["state"], metrics = compiled(box["state"], batch)  # the state is donated: always carry the new one
        box["loss"] = metrics["loss"]
        jax.block_until_ready(metrics["loss"])  # all outputs of one execution complete together

    extra = {"optimizer": args.optimizer, "micro_batches": args.micro_batches,
             "state_bytes_per_device": {
                 "params": common.tree_bytes_per_device(program.abstract_state["params"]),
                 "opt_state": common.tree_bytes_per_device(program.abstract_state["opt_state"])}}
    try:
        result = common.measure("train", "vit-jax bench train", argv, args, program,
                                lambda: program.train_step.lower(program.abstract_state, spec), run_step,
                                program.flops_per_image, extra, compared, unavailable)
    finally:
        for peer in compared:
            peer.close()
    if not args.compile_only:
        result["final_loss"] = float(box["loss"])
        common.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
