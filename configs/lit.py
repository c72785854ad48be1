"""LiT: a locked image tower, a text tower trained to match it (Zhai et al. 2022, "LiT: Zero-Shot Transfer with
Locked-image text Tuning"), with SigLIP's sigmoid loss (SigLiT in Zhai et al. 2023).

    python -m vit_jax.main --config=configs/lit.py:ckpt=PATH,variant=B/16,pool=token,dataset=NAME,tokenizer=PATH \
        --workdir=...
    args: ckpt= the image tower's checkpoint (any file `vit-jax convert` reads: ours, official/big_vision .npz, timm
          .safetensors); variant= and pool= its architecture (default B/16 with a class token, as the official
          ImageNet-21k checkpoints); dataset=, caption=, tokenizer=, eval_split=, examples=, batch= as configs/siglip.py

The paper's best setting ("LU" in its terms) is what this does: the image tower is loaded and locked (never updated:
its parameters are the objective's extra state, saved with the run), the text tower is trained from scratch, and the
image embedding is a linear projection of the locked tower's representation (the pre-logits; the checkpoint's own
classification head is not part of the tower). The text tower, the loss and the optimizer are configs/siglip.py's
(B-sized text Transformer over 64 tokens; AdamW lr 1e-3, wd 1e-4, beta2 0.95, cosine; batch 32k): a locked tower needs
no other recipe, and the SigLIP paper trains its SigLiT models with that loss.

Target topology: as configs/siglip.py (v3:8x8); the locked tower costs a forward pass only.
"""

from pathlib import Path

from vit_jax.errors import ConfigError
from vit_jax.train.config import config_module, parse_config_args

POOLS = ("token", "gap", "map")


def get_config(arg=None):
    siglip = config_module(Path(__file__).with_name("siglip.py"))
    a = parse_config_args(arg, {"ckpt": "", "variant": "B/16", "pool": "token", **siglip.DEFAULTS})
    if not a["ckpt"]:
        raise ConfigError("configs/lit.py needs ckpt=PATH: the checkpoint of the image tower to lock")
    if a["pool"] not in POOLS:
        raise ConfigError(f"configs/lit.py:pool={a['pool']}: choose the locked tower's pooling, one of "
                          f"{', '.join(POOLS)}")
    passed = ",".join(f"{k}={a[k]}" for k in siglip.DEFAULTS)
    siglip.data_args(a, "lit.py")
    c = siglip.get_config(passed)
    c.model.variant = a["variant"]
    c.model.pool = a["pool"]
    c.model.remat = "none"  # a locked tower keeps no activations for a backward pass
    c.siglip.lock_image = a["ckpt"]
    return c
