"""`vit-jax convert --checkpoint SRC --output DST --to {official,big_vision,timm,siglip}`: change a checkpoint's layout,
optionally with surgery (`vit-jax convert SRC DST`, the old spelling, still works).

SRC may be an official/big_vision `.npz`, a timm `.safetensors` exported by us, or one of our training checkpoints
(a workdir, its `checkpoints/` folder, or one step folder); or a BiT ResNet-v2 as a big_transfer `.npz` or a timm
`resnetv2_*_bit` `.safetensors`, which `--to official` writes in the big_transfer layout and `--to timm` as timm's. The architecture is inferred from SRC; a SRC that does
not record its resolution (fixed sin-cos posemb, non-square patch grid) needs --source-image-size. `--to siglip`
writes both towers of an image-text run (objective siglip, or LiT's locked tower with its text tower) in big_vision's
SigLIP .npz layout (checkpoints/siglip_formats.py).
"""

from __future__ import annotations

import argparse
import sys

from vit_jax import cli_args
from vit_jax.checkpoints import formats, siglip_formats
from vit_jax.checkpoints.loading import load_with_size, parse_size
from vit_jax.checkpoints.surgery import RESIZE_METHODS
from vit_jax.models.build import describe, family_of


def main(argv: list[str] | None = None) -> int:
    ap = cli_args.ArgumentParser(prog="vit-jax convert", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", dest="src", metavar="SRC", help="the checkpoint to convert")
    ap.add_argument("--output", dest="dst", type=cli_args.output_path, metavar="DST", help="the file to write")
    ap.add_argument("paths", nargs="*", help=argparse.SUPPRESS)  # SRC DST: the old positional spelling
    ap.add_argument("--to", required=True, choices=formats.targets())
    ap.add_argument("--image-size", type=parse_size, help="new resolution, e.g. 384 or 384x512: resizes the posemb")
    ap.add_argument("--source-image-size", type=parse_size,
                    help="resolution of SRC where it does not record one (sin-cos posemb, non-square patch grid)")
    ap.add_argument("--num-classes", type=int, help="replace the head with a zero-initialised one of this size")
    ap.add_argument("--drop-pre-logits", action="store_true", help="remove the representation layer")
    ap.add_argument("--posemb-method", default="bicubic", choices=RESIZE_METHODS)
    args = ap.parse_args(argv)
    if args.paths:
        if len(args.paths) != 2 or args.src or args.dst:
            ap.error("give --checkpoint SRC --output DST")
        print("vit-jax convert: SRC DST as positional arguments is deprecated; use --checkpoint SRC --output DST",
              file=sys.stderr)
        args.src, args.dst = args.paths
    if not (args.src and args.dst):
        ap.error("the following arguments are required: --checkpoint, --output")

    request = formats.ExportRequest(to=args.to, image_size=args.image_size, num_classes=args.num_classes,
                                    drop_pre_logits=args.drop_pre_logits, posemb_method=args.posemb_method)
    if args.to == siglip_formats.TARGET:
        return _two_towers(args, request)
    loaded = load_with_size(args.src, args.source_image_size, "--source-image-size")
    if loaded is None:
        return 2
    cfg, params = loaded
    print(f"loaded {args.src}: {describe(cfg)}")
    try:  # the family's exporter (its layouts and surgery: checkpoints/formats.py)
        cfg, notes, layout = formats.exporter_for(family_of(cfg).name).export(cfg, params, args.dst, request)
    except formats.ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"  {note}")
    print(f"wrote {args.dst} ({layout}): {describe(cfg)}")
    return 0


def _two_towers(args: argparse.Namespace, request: formats.ExportRequest) -> int:
    """`--to siglip`: both towers of a siglip/clip run (or a SigLIP .npz), which load_any would read as one ViT."""
    from vit_jax.train.objectives.image_text import load_image_text

    loaded = load_image_text(args.src)
    if loaded is None:
        print(f"error: --to {args.to} writes image-text (two-tower) checkpoints; {args.src} is not a siglip/clip run "
              "or a SigLIP .npz", file=sys.stderr)
        return 2
    spec, params = loaded
    print(f"loaded {args.src}: {spec.name}")
    try:
        spec, notes, layout = formats.exporter_for(siglip_formats.FAMILY).export(spec, params, args.dst, request)
    except formats.ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"  note: {note}")
    print(f"wrote {args.dst} ({layout}): {spec.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
