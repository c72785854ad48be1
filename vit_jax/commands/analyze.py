"""`vit-jax analyze`: the ViT paper's model analyses of a checkpoint (Fig. 6 and 7), each as a PNG plus its numbers.

    vit-jax analyze --checkpoint CKPT --what attention-distance,attention-rollout --images IMAGES.npz --output DIR
    vit-jax analyze --checkpoint CKPT --what all --dataset digits --split test --output DIR

Analyses: attention-distance, posemb-similarity, embedding-pcs, attention-rollout (or `all`). The first and last need
images (--images FILE.npy|FILE.npz|FOLDER, or --dataset NAME --split SPLIT). Each writes WHAT.png, WHAT.npz and
WHAT.json (shapes, settings and the numbers) into --output. See docs/analyses.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from vit_jax import cli_args

ANALYSES = ("attention-distance", "posemb-similarity", "embedding-pcs", "attention-rollout")
NEEDS_IMAGES = {"attention-distance", "attention-rollout"}


def _parser() -> argparse.ArgumentParser:
    p = cli_args.ArgumentParser(prog="vit-jax analyze", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help=".npz (official/big_vision), .safetensors, or a run directory")
    p.add_argument("--what", required=True, help=f"comma-separated: {', '.join(ANALYSES)}, or all")
    p.add_argument("--output", dest="out", type=cli_args.output_path,
                   required=True, metavar="DIR", help="output directory")
    p.add_argument("--images", default=None, help=".npy / .npz (key 'images') array, or a folder of image files")
    p.add_argument("--dataset", default=None, help="dataset name for the data pipeline, e.g. digits")
    p.add_argument("--split", default="test", help="dataset split (with --dataset)")
    p.add_argument("--data-dir", default=None, help="dataset directory (default $TFDS_DATA_DIR)")
    p.add_argument("--pp", default=None, help="preprocessing string for --dataset (default: decode, resize to the "
                                              "model's resolution, value_range(-1,1))")
    p.add_argument("--max-images", type=int, default=64, help="images averaged over (attention distance)")
    p.add_argument("--show", type=int, default=6, help="images drawn in the rollout figure")
    p.add_argument("--batch-size", type=int, default=16)
    return p


def parse_what(text: str) -> list[str]:
    """'all' or a comma-separated list of analyses -> the list (in the order of ANALYSES)."""
    names = {w.strip() for w in text.split(",") if w.strip()}
    if "all" in names:
        return list(ANALYSES)
    unknown = names - set(ANALYSES)
    if unknown or not names:
        raise ValueError(f"unknown analysis {sorted(unknown) or text!r}; choose from {', '.join(ANALYSES)} or all")
    return [a for a in ANALYSES if a in names]


def _write(out: Path, stem: str, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> list[Path]:
    np.savez(out / f"{stem}.npz", **arrays)
    (out / f"{stem}.json").write_text(json.dumps(meta, indent=1) + "\n")
    return [out / f"{stem}.png", out / f"{stem}.npz", out / f"{stem}.json"]


def attention_outputs(cfg, params, images: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-image attention distances (depth, N, heads) and rollout maps (N, patches), batch by batch under jit."""
    import jax
    import jax.numpy as jnp

    from vit_jax.eval.inference import build_inference
    from vit_jax.parallel.mesh import make_mesh
    from vit_jax.report.analyses import attention_distance_per_image, attention_rollout

    # One device: the figures' batches are small and of any size.
    program = build_inference(cfg, params, make_mesh(devices=jax.devices()[:1]))
    model = program.model
    has_cls = cfg.pool == "token"
    patch_px = (cfg.patch_size[0] * cfg.stem_stride, cfg.patch_size[1] * cfg.stem_stride)

    @program.jit
    def reduce(params, x):
        _, out = model.apply(params, x, capture=("attention",))
        attention = out["attention"].astype(jnp.float32)
        return (attention_distance_per_image(attention, cfg.grid, patch_px, has_cls),
                attention_rollout(attention, has_cls))

    params = program.params
    distances, maps = [], []
    n = images.shape[0]
    batch_size = max(1, min(batch_size, n))
    for start in range(0, n, batch_size):
        x = images[start:start + batch_size]
        real = x.shape[0]
        if real < batch_size:  # pad the last batch: one compiled shape
            x = np.concatenate([x, np.zeros((batch_size - real, *x.shape[1:]), x.dtype)])
        d, m = reduce(params, x)
        distances.append(np.asarray(d)[:, :real])
        maps.append(np.asarray(m)[:real])
    return np.concatenate(distances, 1), np.concatenate(maps, 0)


def run_analyses(cfg, params: dict[str, Any], what: list[str], out: Path, *, images: np.ndarray | None = None,
                 batch_size: int = 16, show: int = 6, checkpoint: str = "") -> list[Path]:
    """Runs the analyses on a model (ViTConfig, params) and writes their figures and numbers; returns the paths."""
    from vit_jax.report import analyses as A
    from vit_jax.report import plotting

    out.mkdir(parents=True, exist_ok=True)
    has_cls = cfg.pool == "token"
    patch_px = [cfg.patch_size[0] * cfg.stem_stride, cfg.patch_size[1] * cfg.stem_stride]
    meta = {"checkpoint": str(checkpoint), "model": cfg.name, "image_size": list(cfg.image_size),
            "grid": list(cfg.grid), "patch_pixels": patch_px, "class_token": has_cls}
    written: list[Path] = []

    if NEEDS_IMAGES & set(what):
        if images is None:
            raise ValueError("this analysis needs images: pass --images FILE.npz|FOLDER or --dataset NAME --split S")
        distances, maps = attention_outputs(cfg, params, images, batch_size)
        meta["num_images"] = int(images.shape[0])

    if "attention-distance" in what:
        mean = distances.mean(1)  # (depth, heads)
        plotting.attention_distance_figure(mean, f"{cfg.name}: mean attention distance ({images.shape[0]} images)",
                                           out / "attention_distance.png")
        written += _write(out, "attention_distance", {"distance": mean, "per_image": distances}, {
            **meta, "distance_shape": list(mean.shape), "unit": "pixels",
            "note": "per head: attention-weighted pixel distance between query and key patch centres, averaged "
                    "over query patches and images; the class token is excluded as query and key and each query's "
                    "weights are renormalised over the patches",
            "mean_per_layer": mean.mean(1).astype(float).round(4).tolist(),
            "distance": mean.astype(float).round(4).tolist()})

    if "posemb-similarity" in what:
        posemb = params.get("pos_embedding")
        source = "learned"
        if posemb is None:  # sincos2d models: the fixed embedding the model adds
            from vit_jax.models.vit import posemb_sincos_2d

            posemb, source = posemb_sincos_2d(*cfg.grid, cfg.width), "fixed sincos2d"
        sim = A.posemb_similarity(np.asarray(posemb), cfg.grid, has_cls)
        plotting.posemb_similarity_figure(sim, f"{cfg.name}: position embedding similarity ({source})",
                                          out / "posemb_similarity.png")
        written += _write(out, "posemb_similarity", {"similarity": sim},
                          {**meta, "similarity_shape": list(sim.shape), "posemb": source,
                           "note": "similarity[i, j] is the cosine similarity of patch (i, j)'s position embedding "
                                   "with every patch's; the class-token row is dropped"})

    if "embedding-pcs" in what:
        scaled, comps, ratio = A.embedding_pcs(np.asarray(params["embedding"]["kernel"]))
        plotting.embedding_pcs_figure(scaled, f"{cfg.name}: top {len(ratio)} principal components of the "
                                              "patch-embedding filters", out / "embedding_pcs.png")
        written += _write(out, "embedding_pcs", {"components": scaled, "components_raw": comps,
                                                 "explained_variance_ratio": ratio},
                          {**meta, "components_shape": list(scaled.shape),
                           "explained_variance_ratio": ratio.astype(float).round(5).tolist(),
                           "note": "PCA over the D filters (each ph*pw*3 values, mean filter removed); each "
                                   "component min-max rescaled to [0, 1] for display"})

    if "attention-rollout" in what:
        masks = A.rollout_masks(maps, cfg.grid, cfg.image_size)
        shown = min(show, images.shape[0])
        plotting.attention_rollout_figure(images[:shown], masks[:shown], f"{cfg.name}: attention rollout",
                                          out / "attention_rollout.png")
        written += _write(out, "attention_rollout", {"maps": maps.reshape(-1, *cfg.grid), "masks": masks}, {
            **meta, "maps_shape": [maps.shape[0], *cfg.grid], "masks_shape": list(masks.shape),
            "note": "heads averaged, identity added, rows renormalised, layers multiplied; map = class-token row "
                    "over patches" if has_cls else "heads averaged, identity added, rows renormalised, layers "
                    "multiplied; no class token: map = mean over all query rows"})
    return written


def main(argv: list[str] | None = None) -> int:
    """Entry point of `vit-jax analyze`."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        what = parse_what(args.what)
        from vit_jax import runtime
        from vit_jax.report.analysis_inputs import load_checkpoint, load_images

        runtime.prepare_inference_process()
        images = None
        if NEEDS_IMAGES & set(what) and not (args.images or args.dataset):
            raise ValueError(f"{', '.join(sorted(NEEDS_IMAGES & set(what)))} needs images: pass --images "
                             "FILE.npz|FOLDER or --dataset NAME --split SPLIT")
        cfg, params = load_checkpoint(args.checkpoint)
        if NEEDS_IMAGES & set(what):
            images = load_images(images=args.images, dataset=args.dataset, split=args.split,
                                 image_size=cfg.image_size, max_images=args.max_images, data_dir=args.data_dir,
                                 pp=args.pp)
        written = run_analyses(cfg, params, what, Path(args.out), images=images, batch_size=args.batch_size,
                               show=args.show, checkpoint=args.checkpoint)
    except (ValueError, FileNotFoundError) as e:
        print(f"vit-jax analyze: error: {e}", file=sys.stderr)
        return 2
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
