"""`vit-jax bench data`: input-pipeline throughput against TensorFlow's fused JPEG decode-and-crop.

Generates realistic JPEGs (about 500x375: crops and rescales of the photos scikit-learn ships), prepares them as
an image-folder dataset, and measures in one run:
  (a) our train pipeline end to end (decode -> inception crop 224 -> flip -> value range -> batch), with 1 and
      2 decode workers, once up to the host numpy batch (the work TF does in (b)) and once including the
      transfer into a global jax.Array (on CPU a ~4x-memcpy cost that a real accelerator's DMA does not have);
  (b) the same work with TensorFlow (`tf.image.decode_and_crop_jpeg` + bilinear resize + flip + value range) in a
      single thread, on the same crop boxes;
  (c) the ratio (a)/(b) per core, where "per core" divides by the CPU seconds the process actually used.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

PP = "decode_jpeg_and_inception_crop({size})|flip_lr|value_range(-1, 1)"


def make_jpegs(count: int, seed: int = 0) -> list[bytes]:
    """Photographic ~500x375 JPEGs (quality 90) cut and rescaled from scikit-learn's sample photos."""
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        photo = photos[i % len(photos)]
        h, w = photo.shape[:2]
        ch, cw = int(rng.integers(h // 2, h)), int(rng.integers(w // 2, w))
        y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        size = (500, 375) if rng.uniform() < 0.7 else (375, 500)
        img = Image.fromarray(photo[y : y + ch, x : x + cw]).resize(size, Image.Resampling.BICUBIC)
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def _timed(fn) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def bench_ours(ds, size: int, batch: int, steps: int, workers: int, to_device: bool) -> dict:
    import jax

    from vit_jax.data import pipeline

    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    it = pipeline.BatchIterator(ds, "train", PP.format(size=size), batch, sharding, train=True, seed=0, fraction=1.0,
                                start_step=0, end_step=None, num_workers=workers, prefetch=2, to_device=to_device)
    jax.block_until_ready(next(it))  # warm-up: threads started, first batches in flight

    def run():
        for _ in range(steps):
            jax.block_until_ready(next(it))

    wall, cpu = _timed(run)
    it.close()
    images = steps * batch
    return {"workers": workers, "to_device": to_device, "images": images, "images_per_s": images / wall, "cpu_s": cpu,
            "images_per_cpu_s": images / cpu}


def bench_tensorflow(jpegs: list[bytes], size: int, batch: int, steps: int) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    from vit_jax.data.image_ops import sample_inception_box

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.set_visible_devices([], "GPU")

    @tf.function(input_signature=[tf.TensorSpec([], tf.string), tf.TensorSpec([4], tf.int32),
                                  tf.TensorSpec([], tf.bool)])
    def one(data, box, flip):
        image = tf.image.decode_and_crop_jpeg(data, box, channels=3)
        image = tf.image.resize(image, (size, size))  # bilinear
        image = tf.cond(flip, lambda: tf.image.flip_left_right(image), lambda: image)
        return image * (2.0 / 255.0) - 1.0

    sizes = [Image.open(io.BytesIO(j)).size for j in jpegs]
    rng = np.random.default_rng(0)
    boxes = []
    for w, h in sizes:
        x, y, cw, ch = sample_inception_box(w, h, rng)
        boxes.append(tf.constant([y, x, ch, cw], tf.int32))
    for i in range(4):
        one(jpegs[i], boxes[i], tf.constant(True))

    def run():
        k = 0
        for _ in range(steps):
            rows = []
            for _ in range(batch):
                rows.append(one(jpegs[k % len(jpegs)], boxes[k % len(jpegs)], tf.constant(k % 2 == 0)).numpy())
                k += 1
            np.stack(rows)

    wall, cpu = _timed(run)
    images = steps * batch
    return {"threads": 1, "images": images, "images_per_s": images / wall, "cpu_s": cpu,
            "images_per_cpu_s": images / cpu, "tensorflow": tf.__version__}


def environment() -> dict:
    import jax
    import PIL

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
            "pillow": PIL.__version__, "jax": jax.__version__, "platform": platform.platform()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="vit-jax bench data", description=__doc__.split("\n\n")[0])
    p.add_argument("--num_images", type=int, default=256)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=12, help="batches timed per measurement")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--workers", default="1,2", help="comma-separated decode worker counts")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)

    from vit_jax.data import datasets

    jpegs = make_jpegs(args.num_images)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "images" / "photo"
        root.mkdir(parents=True)
        for i, data in enumerate(jpegs):
            (root / f"{i:05d}.jpg").write_bytes(data)
        import contextlib

        with contextlib.redirect_stdout(sys.stderr):  # keep --json output clean of build chatter
            ds = datasets.open_dataset(f"folder:{root.parent}", data_dir=str(Path(tmp) / "tfds"))
        ours = [bench_ours(ds, args.size, args.batch, args.steps, int(w), to_device)
                for to_device in (False, True) for w in args.workers.split(",")]
    reference = bench_tensorflow(jpegs, args.size, args.batch, args.steps)
    one_worker = next((r for r in ours if r["workers"] == 1 and not r["to_device"]), ours[0])
    result = {"environment": environment(), "pp": PP.format(size=args.size), "batch": args.batch,
              "mean_jpeg_bytes": int(np.mean([len(j) for j in jpegs])), "ours": ours, "tensorflow": reference,
              "ratio_per_core": one_worker["images_per_cpu_s"] / reference["images_per_cpu_s"]}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"machine: {result['environment']['cpu']} ({result['environment']['cores']} cores)")
    for r in ours:
        what = "global jax.Array batch" if r["to_device"] else "host numpy batch"
        print(f"(a) ours -> {what}, {r['workers']} worker(s): {r['images_per_s']:8.1f} images/s  "
              f"{r['images_per_cpu_s']:8.1f} images/cpu-s")
    print(f"(b) tf.image.decode_and_crop_jpeg, 1 thread: {reference['images_per_s']:8.1f} images/s  "
          f"{reference['images_per_cpu_s']:8.1f} images/cpu-s")
    print(f"(c) ratio per core (a: host batch, 1 worker)/(b): {result['ratio_per_core']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
