"""`vit-jax eval --checkpoint CKPT [--dataset NAME --split S] [--fewshot A,B --shots 1,5,10,25]`.

Evaluates any checkpoint (ours, official/big_vision .npz, timm .safetensors): top-1/top-5/precision@1/loss on a
split with exact counts, and/or the paper's few-shot linear evaluation on frozen pre-logits features. Our
checkpoints record their dataset and eval preprocessing, so `--checkpoint` alone is enough for them.
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
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--fewshot", default="", help="comma-separated datasets for few-shot linear evaluation")
    ap.add_argument("--shots", default="1,5,10,25")
    ap.add_argument("--fewshot-train-split", default="train")
    ap.add_argument("--fewshot-test-split", default="",
                    help="default: each dataset's labelled held-out split (test, else validation; imagenet2012: "
                         "validation)")
    ap.add_argument("--fewshot-max-train-examples", type=int, default=0,
                    help="draw the shots from the first N training examples only (0: all)")
    ap.add_argument("--l2-reg", type=float, default=1e-2)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args(argv)

    from vit_jax import runtime

    runtime.prepare_inference_process()
    from vit_jax.models.build import describe
    from vit_jax.checkpoints.loading import load_any
    from vit_jax.data import pipeline
    from vit_jax.eval.classification import evaluate
    from vit_jax.eval.fewshot import fewshot_on_datasets
    from vit_jax.eval.inference import build_inference

    cfg, params = load_any(args.checkpoint)
    meta = _recorded(args.checkpoint)
    print(f"checkpoint {args.checkpoint}: {describe(cfg)}")
    program = build_inference(cfg, params)
    batch_sh = program.batch_sh
    batch_size = program.global_batch(args.batch_size)
    h, w = cfg.image_size
    pp = args.pp or meta.get("pp_eval") or f"decode|resize({h},{w})|value_range(-1,1)"
    data_dir = args.data_dir or (meta.get("config", {}).get("data", {}).get("data_dir") or None)
    results: dict[str, float] = {}

    dataset = args.dataset or meta.get("dataset", {}).get("name")
    if dataset and cfg.num_classes:
        ds = pipeline.open_dataset(dataset, data_dir=data_dir)
        if ds.num_classes != cfg.num_classes:
            print(f"error: {dataset} has {ds.num_classes} classes but the checkpoint's head has {cfg.num_classes}; "
                  "use --fewshot for a dataset with other classes", file=sys.stderr)
            return 2
        split = args.split or meta.get("config", {}).get("data", {}).get("eval_split") or "test"
        loss_kind = meta.get("config", {}).get("loss", {}).get("kind", "softmax_xent")
        batches = pipeline.eval_iterator(ds, split=split, pp=pp, global_batch_size=batch_size, sharding=batch_sh)
        out = evaluate(program.eval_step(loss_kind), program.params, batches)
        results.update({f"eval/{k}": v for k, v in out.items()})
        print(f"{dataset}/{split}: top1 {100 * out['top1']:.2f}% | top5 {100 * out['top5']:.2f}% | "
              f"prec@1 {100 * out['prec1']:.2f}% | loss {out['loss']:.4f} | {int(out['count'])} examples")
    if args.fewshot:
        out = fewshot_on_datasets(program.features(), program.params, [n for n in args.fewshot.split(",") if n],
                                  data_dir=data_dir, pp=pp, batch_size=batch_size, sharding=batch_sh, train_split=args.fewshot_train_split,
                                  test_split=args.fewshot_test_split,
                                  shots=[int(s) for s in args.shots.split(",")], l2_reg=args.l2_reg,
                                  seeds=args.seeds, max_test_examples=10**9,
                                  max_train_examples=args.fewshot_max_train_examples)
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


def _recorded(path: str) -> dict:
    from etils import epath

    if not epath.Path(path).is_dir():  # a run directory, local or gs://, records its data; a weights file does not
        return {}
    from vit_jax.checkpoints.training import load_run_metadata

    return load_run_metadata(path)


if __name__ == "__main__":
    sys.exit(main())
