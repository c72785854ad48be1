"""timm parity of the BiT ResNet-v2 family (not part of the test suite: timm and torch are not dependencies).

Three steps, alternating between an environment with torch + timm and vit_jax's own:

  python3 -m venv /tmp/timmenv && /tmp/timmenv/bin/pip install torch timm safetensors numpy
  OUT=$(mktemp -d)
  /tmp/timmenv/bin/python tools/timm_parity_bit.py make "$OUT"      # timm: random resnetv2_*_bit -> safetensors
  .venv/bin/python tools/timm_parity_bit.py predict "$OUT"         # ours: `vit-jax predict` on it, and convert to npz
  /tmp/timmenv/bin/python tools/timm_parity_bit.py check-npz "$OUT" # timm reads our big_transfer .npz export

`make` saves timm models' state dicts exactly as a timm user would (`safetensors.torch.save_file(model.state_dict())`),
with the GroupNorm affines and the head randomised (a unit gain and zero bias everywhere would hide a swapped
scale/bias), NHWC images and timm's logits in fp32 and float64. `predict` prints max |timm - ours| per model at fp32,
and both fp32 results' distance to timm's float64 logits; it exits 1 if ours is over 1e-4 from the float64 ones. (With
these random weights the residual stream of R50x1 grows to logits of ~14, and timm's own fp32 result is 3e-4 from its
float64 one: the fp32-vs-fp32 difference measures the two roundings, the float64 comparison the function.) `check-npz` loads our `vit-jax convert --to official` output with timm's own big_transfer loader
(`model.load_pretrained`) and compares with timm's logits of the original weights (exits 1 above 1e-4).
"""

import sys

# name -> (ResNetV2 kwargs, image size); a name timm registers is built with timm.create_model(name) itself, the others
# as timm builds its BiT models (fixed stem padding, StdConv2d with eps 1e-8).
CASES = {
    "resnetv2_50x1_bit": (dict(num_classes=1000), 224),
    "tiny_1-1x1": (dict(num_classes=7, layers=[1, 1], channels=(256, 512)), 64),
    "tiny_1-1-1-1x2": (dict(num_classes=7, layers=[1, 1, 1, 1], width_factor=2), 96),
}
TOLERANCE = 1e-4


def timm_model(name: str, kwargs: dict):
    from functools import partial

    import timm
    from timm.layers import StdConv2d
    from timm.models.resnetv2 import ResNetV2

    if name in timm.list_models():
        return timm.create_model(name, pretrained=False, **kwargs).eval()
    return ResNetV2(stem_type="fixed", conv_layer=partial(StdConv2d, eps=1e-8), **kwargs).eval()


def make(out: str) -> int:
    import numpy as np
    import timm
    import torch
    from safetensors.torch import save_file

    print(f"timm {timm.__version__}, torch {torch.__version__}")
    torch.manual_seed(0)
    for name, (kwargs, size) in CASES.items():
        model = timm_model(name, kwargs)
        with torch.no_grad():
            for key, p in model.named_parameters():
                if p.ndim == 1 or key.startswith("head."):  # GroupNorm affines and the head: random
                    unit = 1.0 if (p.ndim == 1 and key.endswith(".weight")) else 0.0
                    p.copy_(torch.randn_like(p) * 0.2 + unit)
        images = np.random.default_rng(0).uniform(-1, 1, (2, size, size, 3)).astype(np.float32)
        with torch.no_grad():
            logits = model(torch.from_numpy(images).permute(0, 3, 1, 2)).numpy()
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, f"{out}/{name}.safetensors")
        np.savez(f"{out}/{name}_images.npz", images=images)
        np.save(f"{out}/{name}_timm.npy", logits)
        with torch.no_grad():  # the same function in float64: the reference both fp32 implementations round away from
            np.save(f"{out}/{name}_timm64.npy", model.double()(torch.from_numpy(images).double().permute(0, 3, 1, 2))
                    .numpy())
        print(f"{name}: {sum(p.numel() for p in model.parameters()):,} parameters, logits up to "
              f"{np.abs(logits).max():.2f}")
    return 0


def predict(out: str) -> int:
    import numpy as np

    from vit_jax import cli

    worst = 0.0
    for name in CASES:
        ours = f"{out}/{name}_ours.npy"
        rc = cli.main(["predict", "--checkpoint", f"{out}/{name}.safetensors", "--images",
                       f"{out}/{name}_images.npz", "--output", ours])
        rc = rc or cli.main(["convert", f"{out}/{name}.safetensors", f"{out}/{name}.npz", "--to", "official"])
        if rc:
            return rc
        logits, timm32, timm64 = (np.load(f"{out}/{name}{s}.npy") for s in ("_ours", "_timm", "_timm64"))
        diff = float(np.abs(logits - timm32).max())
        worst = max(worst, float(np.abs(logits - timm64).max()))
        print(f"{name:<18} max |timm - ours| = {diff:.2e} (both fp32); vs timm in float64: ours "
              f"{np.abs(logits - timm64).max():.2e}, timm's fp32 {np.abs(timm32 - timm64).max():.2e}")
    return 0 if worst <= TOLERANCE else 1


def check_npz(out: str) -> int:
    import numpy as np
    import torch

    worst = 0.0
    for name, (kwargs, _) in CASES.items():
        model = timm_model(name, kwargs)
        model.load_pretrained(f"{out}/{name}.npz")
        images = np.load(f"{out}/{name}_images.npz")["images"]
        with torch.no_grad():
            logits = model(torch.from_numpy(images).permute(0, 3, 1, 2)).numpy()
        diff = float(np.abs(logits - np.load(f"{out}/{name}_timm.npy")).max())
        worst = max(worst, diff)
        print(f"{name:<18} timm on our big_transfer .npz: max |diff| = {diff:.2e}")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    steps = {"make": make, "predict": predict, "check-npz": check_npz}
    if len(sys.argv) != 3 or sys.argv[1] not in steps:
        sys.exit(f"usage: {sys.argv[0]} {{{'|'.join(steps)}}} OUT_DIR")
    sys.exit(steps[sys.argv[1]](sys.argv[2]))
