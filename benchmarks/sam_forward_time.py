"""CPU forward time of SAM-B's image encoder at 1024 px, windowed (14x14 windows, global blocks 2, 5, 8, 11) against
the same model with every block global, alternated in one process so both see the same machine (docs/BENCHMARKS.md,
"SAM-B at 1024²").

    python benchmarks/sam_forward_time.py [ROUNDS]     # default 3; prints one JSON line
"""

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.models import vit_config
from vit_jax.models.vit import FunctionalViT


def main(rounds: int) -> dict:
    spatial = dict(image_size=1024, rel_pos=True, dense=True)
    configs = {"windowed": vit_config("B/16", window_size=14, global_blocks=(2, 5, 8, 11), **spatial),
               "global": vit_config("B/16", **spatial)}
    images = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (1, 1024, 1024, 3)), jnp.float32)
    forward, params = {}, {}
    for name, cfg in configs.items():
        model = FunctionalViT(cfg)
        params[name] = model.init(jax.random.key(0))
        forward[name] = jax.jit(lambda p, x, m=model: m.apply(p, x)[0])
        forward[name](params[name], images).block_until_ready()  # compile (and a first, untimed run)
    times: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(rounds):
        for name in configs:
            start = time.perf_counter()
            forward[name](params[name], images).block_until_ready()
            times[name].append(time.perf_counter() - start)
    return {name: {"median_s": float(np.median(t)), "times_s": [round(x, 3) for x in t]} for name, t in times.items()}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)))
