"""`vit-jax convert SRC DST --to {official,big_vision,timm}`: change a checkpoint's layout, optionally with surgery.

SRC may be an official/big_vision `.npz`, a timm `.safetensors` exported by us, or one of our training checkpoints
(a workdir, its `checkpoints/` folder, or one step folder); or a BiT ResNet-v2 as a big_transfer `.npz` or a timm
`resnetv2_*_bit` `.safetensors`, which `--to official` writes in the big_transfer layout and `--to timm` as timm's. The architecture is inferred from SRC; a SRC that does
not record its resolution (fixed sin-cos posemb, non-square patch grid) needs --source-image-size.
"""

from __future__ import annotations

import argparse
import sys

import jax
import numpy as np

from vit_jax import cli_args
from vit_jax.checkpoints.layouts import LAYOUTS
from vit_jax.checkpoints.loading import load_with_size, parse_size
from vit_jax.checkpoints.npz import save_npz_params
from vit_jax.checkpoints.surgery import RESIZE_METHODS, adapt_params
from vit_jax.checkpoints.timm import save_timm
from vit_jax.models.bit_config import BiTConfig
from vit_jax.models.build import build_model, describe


def main(argv: list[str] | None = None) -> int:
    ap = cli_args.ArgumentParser(prog="vit-jax convert", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--to", required=True, choices=(*LAYOUTS, "timm"))
    ap.add_argument("--image-size", type=parse_size, help="new resolution, e.g. 384 or 384x512: resizes the posemb")
    ap.add_argument("--source-image-size", type=parse_size,
                    help="resolution of SRC where it does not record one (sin-cos posemb, non-square patch grid)")
    ap.add_argument("--num-classes", type=int, help="replace the head with a zero-initialised one of this size")
    ap.add_argument("--drop-pre-logits", action="store_true", help="remove the representation layer")
    ap.add_argument("--posemb-method", default="bicubic", choices=RESIZE_METHODS)
    args = ap.parse_args(argv)

    loaded = load_with_size(args.src, args.source_image_size, "--source-image-size")
    if loaded is None:
        return 2
    cfg, params = loaded
    print(f"loaded {args.src}: {describe(cfg)}")
    if isinstance(cfg, BiTConfig):
        return convert_bit(args, cfg, params)
    changes = {}
    if args.image_size:
        changes["image_size"] = args.image_size
    if args.num_classes is not None:
        changes["num_classes"] = args.num_classes
    if args.drop_pre_logits:
        changes["rep_size"] = 0
    if changes:
        target = cfg.replace(**changes)
        init = build_model(target).init(jax.random.key(0))
        reinit = ("head",) if "num_classes" in changes or "rep_size" in changes else ()
        params, notes = adapt_params(params, cfg, init, target, reinit=reinit, posemb_method=args.posemb_method)
        for note in notes:
            print(f"  {note}")
        cfg = target
    if args.to == "timm":
        try:
            save_timm(args.dst, params, cfg)  # refuses what timm cannot express before writing anything
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    else:
        save_npz_params(args.dst, params, cfg, layout=args.to)
    print(f"wrote {args.dst} ({args.to} layout): {describe(cfg)}")
    return 0


def convert_bit(args: argparse.Namespace, cfg: BiTConfig, params) -> int:
    """The BiT ResNet-v2 side of `convert`: big_transfer .npz or timm safetensors, with a new zero head on request."""
    from vit_jax.checkpoints.bit import save_bit_npz, save_bit_timm

    if args.to == "big_vision" or args.drop_pre_logits:
        print("error: BiT ResNets have no big_vision layout and no pre-logits layer; use --to official (big_transfer "
              "layout) or --to timm", file=sys.stderr)
        return 2
    if args.image_size:  # BiT's parameters do not depend on the resolution: only the recorded size changes
        cfg = cfg.replace(image_size=args.image_size)
    if args.num_classes is not None:
        cfg = cfg.replace(num_classes=args.num_classes)
        params = {k: v for k, v in params.items() if k != "head"}
        if args.num_classes:
            dtype = params["norm"]["scale"].dtype  # zero-initialised, as BiT initialises its head
            params["head"] = {"kernel": np.zeros((cfg.out_channels, cfg.num_classes), dtype),
                              "bias": np.zeros((cfg.num_classes,), dtype)}
        print(f"  head: replaced by a zero-initialised one of {args.num_classes} classes")
    (save_bit_timm if args.to == "timm" else save_bit_npz)(args.dst, params, cfg)
    print(f"wrote {args.dst} ({'timm' if args.to == 'timm' else 'big_transfer'} layout): {describe(cfg)}")
    return 0
