"""`vit-jax eval --checkpoint CKPT [--dataset NAME --split S] [--fewshot A,B --shots 1,5,10,25]`.

Evaluates any checkpoint (ours, official/big_vision .npz, timm .safetensors): top-1/top-5/precision@1/loss on a
split with exact counts, and/or the paper's few-shot linear evaluation on frozen pre-logits features. Our
checkpoints record their dataset and eval preprocessing, so `--checkpoint` alone is enough for them.

A run gets its objective's own evaluation (train/objectives/: a classifier's top-1; MAE's reconstruction loss; the
masked-patch accuracy; a segmentation's mIoU; any registered objective's), its model restored with any pretraining
head and extra state, at the run's eval batch size unless --batch-size says otherwise (so masks that follow an
example's row in its batch are the ones the run's evaluator drew). Other checkpoints are evaluated as classifiers.
"""

from __future__ import annotations

import argparse
import json
import sys

from vit_jax import cli_args


def main(argv: list[str] | None = None) -> int:
    ap = cli_args.ArgumentParser(prog="vit-jax eval", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--dataset", help="dataset to classify (default: the one recorded in our checkpoints)")
    ap.add_argument("--split", help="split to evaluate (default: the recorded eval split, else 'test')")
    ap.add_argument("--pp", help="eval preprocessing op string (default: recorded, else resize + value_range)")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--batch-size", type=int, default=None,
                    help="global eval batch (default 256; a self-supervised run's: its recorded eval batch size)")
    ap.add_argument("--fewshot", default="", help="comma-separated datasets for few-shot linear evaluation")
    ap.add_argument("--shots", default="1,5,10,25")
    ap.add_argument("--fewshot-train-split", default="train")
    ap.add_argument("--fewshot-test-split", default="",
                    help="default: each dataset's labelled held-out split (test, else validation; imagenet2012: "
                         "validation)")
    ap.add_argument("--fewshot-max-train-examples", type=int, default=0,
                    help="draw the shots from the first N training examples only (0: all)")
    ap.add_argument("--l2-reg", type=float, default=1e-2)
    ap.add_argument("--knn", default="", help="with --fewshot: also weighted k-NN accuracy for these k, e.g. 10,20 "
                    "(cosine, temperature 0.07, over all --fewshot-max-train-examples training features)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--output", dest="json", type=cli_args.output_path,
                    metavar="PATH", help="also write the results to this JSON file")
    args = ap.parse_args(argv)

    from vit_jax import runtime

    runtime.prepare_inference_process()
    from vit_jax.checkpoints.loading import load_any
    from vit_jax.checkpoints.training import load_params_from_run, model_config_from_meta
    from vit_jax.eval.fewshot import fewshot_on_datasets
    from vit_jax.eval.inference import build_inference, global_batch
    from vit_jax.models.build import describe
    from vit_jax.parallel import mesh as mesh_lib

    meta = _recorded(args.checkpoint)
    recorded = meta.get("config", {})
    # One of our runs: the architecture from its metadata, and its arrays read once, by what evaluates them.
    cfg, params = (model_config_from_meta(meta), None) if meta else load_any(args.checkpoint)
    print(f"checkpoint {args.checkpoint}: {describe(cfg)}" + (f", trained by objective '{recorded['objective']}'"
                                                             if "objective" in recorded else ""))
    mesh = mesh_lib.make_mesh()
    batch_sh = mesh_lib.batch_sharding(mesh)
    # A run's evaluator's batch size: masks drawn per row of a batch are then the run's own.
    default_batch = recorded.get("eval", {}).get("batch_size") or recorded.get("batch_size") or 256
    batch_size = global_batch(mesh, args.batch_size or default_batch)
    h, w = cfg.image_size
    pp = args.pp or meta.get("pp_eval") or f"decode|resize({h},{w})|value_range(-1,1)"
    data_dir = args.data_dir or (recorded.get("data", {}).get("data_dir") or None)
    results: dict[str, float] = {}

    dataset = args.dataset or meta.get("dataset", {}).get("name")
    split = args.split or recorded.get("data", {}).get("eval_split") or "test"
    if dataset:
        out = _objective_eval(args.checkpoint, recorded, cfg, params, mesh, dataset, data_dir, pp, batch_size, split)
        if out is None:
            return 2
        results.update(out)
    if args.fewshot:  # on the plain model's features (a self-supervised run's encoder, its head left out)
        program = build_inference(cfg, params if params is not None else load_params_from_run(args.checkpoint)[1],
                                  mesh)
        out = fewshot_on_datasets(program.features(), program.params, [n for n in args.fewshot.split(",") if n],
                                  data_dir=data_dir, pp=pp, batch_size=batch_size, sharding=batch_sh, train_split=args.fewshot_train_split,
                                  test_split=args.fewshot_test_split,
                                  shots=[int(s) for s in args.shots.split(",")], l2_reg=args.l2_reg,
                                  seeds=args.seeds, max_test_examples=10**9,
                                  max_train_examples=args.fewshot_max_train_examples,
                                  knn=tuple(int(k) for k in args.knn.split(",") if k))
        results.update(out)
        for k, v in out.items():
            print(f"{k}: {100 * v:.2f}%")
    if not results:
        print("error: nothing to evaluate: pass --dataset (for a checkpoint with a head) and/or --fewshot",
              file=sys.stderr)
        return 2
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


def _objective_eval(path: str, recorded: dict, cfg, params, mesh, dataset: str, data_dir: str | None, pp: str,
                    batch_size: int, split: str) -> dict[str, float] | None:
    """The checkpoint's objective's own evaluation on `split` (train/objectives/: eval_step, evaluate, report): with
    `params` (a weights file's: a classifier), or, with None, the objective's whole model (any pretraining head or
    decoder) and extra state restored from the run; {} for a classifier without a head; None (after one line on
    stderr) when the dataset does not fit the head."""
    import jax
    import ml_collections

    from vit_jax.checkpoints.training import load_state_from_run
    from vit_jax.data import pipeline
    from vit_jax.eval.inference import build_inference
    from vit_jax.train.config import default_config
    from vit_jax.train.objectives import DEFAULT_OBJECTIVE, OBJECTIVES

    name = recorded.get("objective") or DEFAULT_OBJECTIVE  # a run recorded before objectives existed
    if name not in OBJECTIVES:
        raise SystemExit(f"error: {path} is a run of objective '{name}', which this version of vit_jax does not "
                         f"know ({', '.join(OBJECTIVES)}); evaluate it with --fewshot")
    config = ml_collections.ConfigDict(recorded) if recorded else default_config()
    if params is None:  # a run: the files it keeps (its tokenizer) are used from its workdir
        OBJECTIVES[name].keep_with_run(config, path, write=False)
    objective = OBJECTIVES[name].from_config(config, cfg)
    # The run's own op modules (data.pp_modules, e.g. the image-text ops), which its eval op string may name.
    pipeline.pp_lib.load_modules(tuple(config.get("data", {}).get("pp_modules", ()) or ()))
    ds = pipeline.open_dataset(dataset, data_dir=data_dir)
    if objective.uses_labels:
        if not cfg.num_classes:
            return {}  # a headless encoder: --fewshot evaluates it
        if ds.num_classes != cfg.num_classes:
            print(f"error: {dataset} has {ds.num_classes} classes but the checkpoint's head has {cfg.num_classes}; "
                  "use --fewshot for a dataset with other classes", file=sys.stderr)
            return None
    state = {"params": params}
    if params is None:  # a run: the objective's whole model (a pretraining head, a decoder) and its extra state
        extra_shapes = objective.extra_shapes()
        _, state = load_state_from_run(path, {"params": objective.model.shapes,
                                              **({"extra": extra_shapes} if extra_shapes is not None else {})})
    program = build_inference(cfg, state["params"], mesh, model=objective.model, extra=state.get("extra"),
                              extra_axes=objective.extra_logical_axes())
    batches = pipeline.eval_iterator(ds, split=split, pp=pp, global_batch_size=batch_size, sharding=program.batch_sh)
    out = objective.evaluate(program.jit_view(objective.eval_step()), program.view(), batches)
    report = objective.report(out, config)
    undecodable = int(out.get("undecodable", 0))
    print(f"{dataset}/{split}: {report.line}" + (f" ({undecodable} undecodable, not counted)" if undecodable else ""))
    return dict(report.metrics)


def _recorded(path: str) -> dict:
    from etils import epath

    if not epath.Path(path).is_dir():  # a run directory, local or gs://, records its data; a weights file does not
        return {}
    from vit_jax.checkpoints.training import load_run_metadata

    return load_run_metadata(path)


if __name__ == "__main__":
    sys.exit(main())
