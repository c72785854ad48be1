"""Step 2 of the timm parity check (run with an environment that has torch and timm): timm's logits vs ours.

Plain ViTs: `VisionTransformer(**timm_kwargs)` from the file's metadata, `load_state_dict(strict=True)`. The hybrid:
timm's own official-npz loader into a VisionTransformer with a HybridEmbed(ResNetV2) stem, built the way timm builds
its R50+ViT models. Exits 1 if any case differs from our logits by more than 1e-5.
"""

import json
import sys
from functools import partial

import numpy as np
import timm
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from timm.layers import StdConv2dSame
from timm.models.resnetv2 import ResNetV2, create_resnetv2_stem
from timm.models.vision_transformer import VisionTransformer, _load_weights
from timm.models.vision_transformer_hybrid import HybridEmbed


def timm_model(out: str, name: str) -> VisionTransformer:
    if name.startswith("hybrid"):
        conv = partial(StdConv2dSame, eps=1e-8)
        if name == "hybrid_root":  # the root alone, as timm builds R+ViT-Ti
            backbone, patch = create_resnetv2_stem(3, stem_type="same", preact=False, conv_layer=conv), 8
        else:
            backbone = ResNetV2(layers=(1, 1), num_classes=0, global_pool="", in_chans=3, preact=False,
                                stem_type="same", conv_layer=conv)
            patch = 1
        model = VisionTransformer(img_size=64, patch_size=patch, embed_dim=48, depth=2, num_heads=3, mlp_ratio=2,
                                  num_classes=7, act_layer="gelu_tanh",
                                  embed_layer=partial(HybridEmbed, backbone=backbone))
        _load_weights(model, f"{out}/{name}.npz")
        return model.eval()
    path = f"{out}/{name}.safetensors"
    with safe_open(path, "pt") as f:
        kwargs = json.loads(f.metadata()["timm_kwargs"])
    model = VisionTransformer(**kwargs)
    model.load_state_dict(load_file(path), strict=True)
    return model.eval()


def main(out: str) -> int:
    print(f"timm {timm.__version__}, torch {torch.__version__}")
    worst = 0.0
    for name in ("token_tanh", "gap_tanh", "map_erf", "token_rect", "hybrid", "hybrid_root"):
        images = torch.from_numpy(np.load(f"{out}/{name}_images.npy")).permute(0, 3, 1, 2)
        with torch.no_grad():
            logits = timm_model(out, name)(images).numpy()
        ours = np.load(f"{out}/{name}_logits.npy")
        diff = float(np.abs(logits - ours).max())
        worst = max(worst, diff)
        print(f"{name:<11} max |timm - ours| = {diff:.2e} (logits up to {np.abs(ours).max():.2f})")
    return 0 if worst <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
