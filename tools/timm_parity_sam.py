"""timm parity of SAM-style backbones: timm's VisionTransformerSAM.forward_features vs our dense features (fp32).

Two steps in two environments (torch and timm are not vit_jax dependencies):

    $TIMM_PYTHON tools/timm_parity_sam.py timm OUT     # torch + timm: random-weight models, images, timm's features
    .venv/bin/python tools/timm_parity_sam.py ours OUT  # vit_jax: loads the state dicts, prints max |timm - ours|

Cases: `samvit_base_patch16` exactly as timm registers it (SAM's ViT-B image encoder, 1024 px; random weights, as
the released ones cannot be downloaded here) and a tiny windowed model whose 5x5 grid is padded to 3x3 windows.
Every parameter is perturbed (timm initialises rel_pos tables and pos_embed to zero, which would hide them). Exits 1
when a case differs by more than 1e-4.
"""

import sys

import numpy as np

CASES = {
    "samvit_base_patch16": dict(images=1, size=1024),
    "tiny_padded": dict(images=2, size=80, kwargs=dict(img_size=80, patch_size=16, embed_dim=64, depth=4, num_heads=2,
                                                       window_size=3, global_attn_indexes=[1, 3], use_rel_pos=True,
                                                       neck_chans=32, num_classes=0)),
}


def run_timm(out: str) -> None:
    import timm
    import torch
    from safetensors.torch import save_file
    from timm.models.vision_transformer_sam import VisionTransformerSAM

    print(f"timm {timm.__version__}, torch {torch.__version__}")
    torch.manual_seed(0)
    for name, case in CASES.items():
        if "kwargs" in case:
            model = VisionTransformerSAM(**case["kwargs"])
        else:
            model = timm.create_model(name, pretrained=False, num_classes=0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.02 * torch.randn_like(p))
        model.eval()
        images = torch.rand(case["images"], 3, case["size"], case["size"]) * 2 - 1
        with torch.no_grad():
            features = model.forward_features(images)  # (B, C, H, W)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, f"{out}/{name}.safetensors")
        np.save(f"{out}/{name}_images.npy", images.permute(0, 2, 3, 1).numpy())  # NHWC for vit_jax
        np.save(f"{out}/{name}_features.npy", features.permute(0, 2, 3, 1).numpy())


def run_ours(out: str) -> int:
    import jax

    from vit_jax.checkpoints.loading import load_any
    from vit_jax.models.vit import FunctionalViT

    worst = 0.0
    for name in CASES:
        cfg, params = load_any(f"{out}/{name}.safetensors")
        model = FunctionalViT(cfg)
        images = np.load(f"{out}/{name}_images.npy")
        ours = np.asarray(jax.jit(lambda p, x: model.apply(p, x)[0])(params, images))
        ref = np.load(f"{out}/{name}_features.npy")
        diff = float(np.abs(ours - ref).max())
        worst = max(worst, diff)
        print(f"{name:<20} {cfg.name} window {cfg.window_size} global {cfg.global_blocks}: features "
              f"{ours.shape}, max |timm - ours| = {diff:.2e} (features up to {np.abs(ref).max():.2f})")
    return 0 if worst <= 1e-4 else 1


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("timm", "ours"):
        sys.exit(__doc__)
    sys.exit(run_timm(sys.argv[2]) if sys.argv[1] == "timm" else run_ours(sys.argv[2]))
