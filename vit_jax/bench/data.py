"""`vit-jax bench data`: input-pipeline throughput against TensorFlow's fused JPEG decode-and-crop.
(`vit-jax bench data --remote`: the same train iterator streaming from a bucket against local disk, data_remote.py.)

Generates realistic JPEGs (about 500x375: crops and rescales of the photos scikit-learn ships), prepares them as
an image-folder dataset, and measures in one run:
  (a) our train pipeline end to end (record read -> decode -> inception crop -> flip -> value range -> batch),
      with 1 and 2 decode workers, once up to the host numpy batch (the work TF does in (b)) and once including
      the transfer into a global jax.Array (on CPU a memcpy cost that a real accelerator's DMA does not have);
  (b) the same work with TensorFlow in a single thread, on the same crop boxes: a tf.data pipeline that reads the
      same serialized tf.Examples (written as a TFRecord file) and parses them (`tf.io.parse_single_example`),
      then `tf.image.decode_and_crop_jpeg` + bilinear resize + flip + value range, map + batch, one private
      thread, one intra-op thread: what big_vision's input pipeline does per image. (b-mem) is that pipeline
      over the JPEG bytes held in memory (no read, no parse: less work than ours; the reference of earlier
      reports). For continuity it also runs the function as one tf.function call per image from Python (b'),
      which mostly measures eager dispatch;
  (c) the ratio (a)/(b) per core, where "per core" divides by the CPU seconds the process actually used.

Every measurement is repeated (`--repeats`) in interleaved rounds and the best round is reported, for (a) and (b)
alike: other jobs on a shared machine only ever make a round slower. `--stages` adds a single-thread cost
breakdown per image of both pipelines.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np
from PIL import Image

from vit_jax import cli_args

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


def _result(images: int, wall: float, cpu: float, **info) -> dict:
    return {**info, "images": images, "images_per_s": images / wall, "cpu_s": cpu, "images_per_cpu_s": images / cpu}


def bench_ours(ds, size: int, batch: int, steps: int, workers: int, to_device: bool) -> dict:
    import jax

    from vit_jax.data import pipeline

    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    it = pipeline.BatchIterator(ds, "train", PP.format(size=size), batch, sharding, train=True, seed=0, fraction=1.0,
                                start_step=0, end_step=None, num_workers=workers, prefetch=2, to_device=to_device)
    for _ in range(5):  # warm-up to the steady state: threads started, batches in flight, host arrays recycled
        jax.block_until_ready(next(it))

    def run():
        for _ in range(steps):
            jax.block_until_ready(next(it))

    wall, cpu = _timed(run)
    it.close()
    return _result(steps * batch, wall, cpu, workers=workers, to_device=to_device)


def _inception_boxes(jpegs: list[bytes]) -> list[tuple[int, int, int, int]]:
    from vit_jax.data.image_ops import sample_inception_box

    rng = np.random.default_rng(0)
    return [sample_inception_box(*Image.open(io.BytesIO(j)).size, rng) for j in jpegs]


def _tensorflow():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:
        # Only when something in this process already ran TensorFlow (the test suite does; the `bench` command
        # never does): its thread pools are fixed by then, so the reference runs with TF's own thread count.
        print("note: TensorFlow was initialised before the benchmark; its reference is not single-threaded",
              file=sys.stderr)
    return tf


class TensorflowReference:
    """(b): TF's decode_and_crop_jpeg + resize + flip + value range + batch, single-threaded, in a tf.data pipeline
    that reads and parses the same records ours does (the serialized tf.Examples, as a TFRecord file). (b-mem): the
    same pipeline over the JPEG bytes held in memory (no read, no parse). (b'): one tf.function call per image."""

    def __init__(self, records: list[bytes], size: int, batch: int, tfrecord_path: Path) -> None:
        tf = self.tf = _tensorflow()
        # Every feature of our image-folder records, so that TF parses as much as our parser does.
        spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64),
                "labels": tf.io.VarLenFeature(tf.int64), "id": tf.io.FixedLenFeature([], tf.string)}
        examples = [tf.train.Example.FromString(r) for r in records]
        assert all(set(e.features.feature) == set(spec) for e in examples), "not image-folder records"
        self.jpegs = [e.features.feature["image"].bytes_list.value[0] for e in examples]
        self.batch = batch
        self.boxes = np.asarray([(y, x, h, w) for x, y, w, h in _inception_boxes(self.jpegs)], np.int32)  # TF's
        self.flips = np.arange(len(self.jpegs)) % 2 == 0
        self.tfrecord_path = str(tfrecord_path)
        with tf.io.TFRecordWriter(self.tfrecord_path) as writer:
            for r in records:
                writer.write(r)

        def crop(data, box):
            return tf.image.decode_and_crop_jpeg(data, box, channels=3)

        def resize(image):
            return tf.image.resize(image, (size, size))  # bilinear, antialias=False, half-pixel centres

        def finish(image, flip):
            image = tf.cond(flip, lambda: tf.image.flip_left_right(image), lambda: image)
            return image * (2.0 / 255.0) - 1.0

        def parsed(record):
            return tf.io.parse_single_example(record, spec)["image"]

        self.fns = {"all": lambda d, b, f: finish(resize(crop(d, b)), f),
                    "records": lambda r, b, f: finish(resize(crop(parsed(r), b)), f),
                    "decode_and_crop": lambda d, b, f: tf.shape(crop(d, b)),
                    "decode_and_crop+resize": lambda d, b, f: resize(crop(d, b))[0, 0]}
        self.one = tf.function(self.fns["all"], input_signature=[
            tf.TensorSpec([], tf.string), tf.TensorSpec([4], tf.int32), tf.TensorSpec([], tf.bool)])
        self._iterators = {}

    def _iterator(self, what: str):
        if what not in self._iterators:
            tf = self.tf
            options = tf.data.Options()
            options.threading.private_threadpool_size = 1
            options.threading.max_intra_op_parallelism = 1
            options.autotune.enabled = False
            options.experimental_optimization.map_parallelization = False
            options.experimental_optimization.inject_prefetch = False  # no background prefetch thread
            if what == "records":  # the records in file order, each with its image's box and flip
                source = tf.data.Dataset.zip((tf.data.TFRecordDataset(self.tfrecord_path),
                                              tf.data.Dataset.from_tensor_slices((self.boxes, self.flips))))
                ds = source.map(lambda r, bf: (r, *bf)).repeat()
            else:
                ds = tf.data.Dataset.from_tensor_slices((self.jpegs, self.boxes, self.flips)).repeat()
            it = iter(ds.map(self.fns[what]).batch(self.batch).with_options(options))
            next(it)
            self._iterators[what] = it
        return self._iterators[what]

    def data(self, steps: int, what: str = "records") -> dict:
        """tf.data, one thread: batches of `what` per step ((b) for "records", (b-mem) for "all")."""
        it = self._iterator(what)

        def run():
            for _ in range(steps):
                next(it).numpy()

        wall, cpu = _timed(run)
        return _result(steps * self.batch, wall, cpu, threads=1, tensorflow=self.tf.__version__)

    def per_call(self, steps: int) -> dict:
        """One tf.function call per image from Python, np.stack per batch (b')."""
        tf = self.tf
        boxes = [tf.constant(b) for b in self.boxes]
        flips = [tf.constant(bool(f)) for f in self.flips]
        n = len(self.jpegs)
        for k in range(2):
            self.one(self.jpegs[k], boxes[k], flips[k])

        def run():
            k = 0
            for _ in range(steps):
                rows = []
                for _ in range(self.batch):
                    rows.append(self.one(self.jpegs[k % n], boxes[k % n], flips[k % n]).numpy())
                    k += 1
                np.stack(rows)

        wall, cpu = _timed(run)
        return _result(steps * self.batch, wall, cpu, threads=1)


def _per_image_ms(fn, items: list, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        cpu = time.thread_time()
        for item in items:
            fn(item)
        best = min(best, (time.thread_time() - cpu) / len(items))
    return best * 1e3


def stages(ds, size: int, reference: TensorflowReference | None) -> dict:
    """Single-thread CPU milliseconds per image of each stage, best of 5 passes (TF: of 5 runs)."""
    from vit_jax.data import cv, decode, indexing, pipeline, pp
    from vit_jax.data.image_ops import sample_inception_box

    loader = pipeline._Loader(ds, "train", PP.format(size=size), seed=0)
    records = list(range(len(loader.source)))
    raws = [loader.source[i] for i in records]
    datas = [raw["image"] for raw in raws]
    boxes = _inception_boxes(datas)
    sizes = [Image.open(io.BytesIO(d)).size for d in datas]
    scales = [decode.jpeg_draft_scale(w, h, size, size) for _, _, w, h in boxes]
    scaled = [decode.scaled_box(*box, s, -(-w // s), -(-h // s)) for box, s, (w, h) in zip(boxes, scales, sizes)]

    def decode_crop(i: int) -> np.ndarray:
        return decode.decode_jpeg_box(datas[i], scales[i], *scaled[i])

    crops = [decode_crop(i) for i in range(len(datas))]
    assert all(c is not None for c in crops)
    resized = [cv.resize(c, size, size) for c in crops]
    row = np.empty((size, size, 3), np.float32)
    value_range = pp.build("value_range(-1, 1)")
    rng = np.random.default_rng(0)
    items = list(range(len(records)))
    ours = {
        "record read + parse": _per_image_ms(lambda i: loader.source[i], items),
        "jpeg header (size)": _per_image_ms(lambda i: decode.jpeg_size(datas[i]), items),
        "example rng + crop box": _per_image_ms(
            lambda i: sample_inception_box(*sizes[i], indexing.example_rng(0, i)), items),
        "(not used) full-frame decode, DCT-scaled (OpenCV)": _per_image_ms(
            lambda i: cv.decode_jpeg(datas[i], scales[i]), items),
        "decode of the crop only, DCT-scaled when the crop allows": _per_image_ms(decode_crop, items),
        "resize": _per_image_ms(lambda i: cv.resize(crops[i], size, size), items),
        "flip": _per_image_ms(lambda i: cv.flip_lr(resized[i]), items),
        "value range into the batch row": _per_image_ms(
            lambda i: value_range({"image": resized[i], pp.IMAGE_OUT: row}, rng), items),
    }
    ours["fused op string (decode_jpeg_and_inception_crop|flip_lr|value_range)"] = _per_image_ms(
        lambda i: loader.preprocess({**raws[i], pp.IMAGE_OUT: row}, indexing.example_rng(0, i)), items)
    ours["loader, all of the above"] = _per_image_ms(lambda i: loader.load_counted(i, i, row), items)
    out = {"ours_ms": ours, "dct_scales": {str(s): scales.count(s) for s in sorted(set(scales))}}
    if reference is not None:
        steps = max(8, 2 * len(items) // reference.batch)
        tf_ms = {what: min(1e3 / reference.data(steps, what)["images_per_cpu_s"] for _ in range(5))
                 for what in ("decode_and_crop", "decode_and_crop+resize", "all", "records")}
        out["tensorflow_ms"] = {"decode_and_crop_jpeg": tf_ms["decode_and_crop"],
                                "+ resize": tf_ms["decode_and_crop+resize"],
                                "+ flip + value range + batch (all, JPEGs in memory)": tf_ms["all"],
                                "all, reading + parsing the records first": tf_ms["records"]}
    return out


def environment() -> dict:
    import cv2
    import jax
    import PIL

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"cpu": cpu, "cores": os.cpu_count(), "load_average_1min": load, "python": platform.python_version(),
            "numpy": np.__version__, "pillow": PIL.__version__, "opencv": cv2.__version__, "jax": jax.__version__,
            "platform": platform.platform()}


def _best(samples: list[dict]) -> dict:
    best = max(samples, key=lambda r: r["images_per_cpu_s"])
    return {**best, "images_per_s": max(r["images_per_s"] for r in samples),
            "rounds_images_per_cpu_s": [round(r["images_per_cpu_s"], 1) for r in samples]}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = cli_args.ArgumentParser(prog="vit-jax bench data", description=__doc__.split("\n\n")[0])
    p.add_argument("--num-images", type=int, default=256)
    p.add_argument("--batch-size", dest="batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=12, help="batches timed per measurement")
    p.add_argument("--image-size", dest="size", type=int, default=224)
    p.add_argument("--workers", default="1,2", help="comma-separated decode worker counts")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds; the best round is reported")
    p.add_argument("--no-device", action="store_true", help="skip the runs that build global jax.Arrays")
    p.add_argument("--no-per-call", action="store_true", help="skip (b'), the per-image tf.function loop")
    p.add_argument("--stages", action="store_true", help="add a per-stage cost breakdown (single thread)")
    p.add_argument("--output", dest="json", type=cli_args.output_path, nargs="?", const="-", default="", metavar="PATH",
                   help="write the result as JSON to PATH (like bench train/eval); bare --output prints it instead "
                        "of the table")
    p.add_argument("--remote", action="store_true", help="bench the bucket stream instead (see data_remote.py)")
    args = p.parse_args(argv)

    from vit_jax.data import datasets, sources

    jpegs = make_jpegs(args.num_images)
    configs = [(int(w), to_device) for to_device in ((False,) if args.no_device else (False, True))
               for w in args.workers.split(",")]
    # These 256 images would fit the cache that keeps small splits parsed in memory; ImageNet's do not, and every
    # record read there is a read and a parse, so that is what is measured.
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(sources, "CACHE_BYTES", 0):
        root = Path(tmp) / "images" / "photo"
        root.mkdir(parents=True)
        for i, data in enumerate(jpegs):
            (root / f"{i:05d}.jpg").write_bytes(data)
        with contextlib.redirect_stdout(sys.stderr):  # keep --output - clean of build chatter
            ds = datasets.open_dataset(f"folder:{root.parent}", data_dir=str(Path(tmp) / "tfds"))
        train = ds.source("train")
        records = [train._records[i] for i in range(len(train))]  # the serialized tf.Examples our pipeline reads
        reference = TensorflowReference(records, args.size, args.batch, Path(tmp) / "train.tfrecord")
        samples: dict = {c: [] for c in configs}
        tf_samples, tf_memory_samples, per_call_samples = [], [], []
        for _ in range(max(1, args.repeats)):
            for workers, to_device in configs:
                samples[(workers, to_device)].append(
                    bench_ours(ds, args.size, args.batch, args.steps, workers, to_device))
            tf_samples.append(reference.data(args.steps))
            tf_memory_samples.append(reference.data(args.steps, "all"))
            if not args.no_per_call:
                per_call_samples.append(reference.per_call(max(1, args.steps // 2)))
        breakdown = stages(ds, args.size, reference) if args.stages else None
    ours = [_best(samples[c]) for c in configs]
    tf_best, tf_memory = _best(tf_samples), _best(tf_memory_samples)
    one_worker = next((r for r in ours if r["workers"] == 1 and not r["to_device"]), ours[0])
    result = {"environment": environment(), "pp": PP.format(size=args.size), "batch": args.batch,
              "repeats": args.repeats, "mean_jpeg_bytes": int(np.mean([len(j) for j in jpegs])), "ours": ours,
              "tensorflow": tf_best, "tensorflow_from_memory": tf_memory,
              "ratio_per_core": one_worker["images_per_cpu_s"] / tf_best["images_per_cpu_s"],
              "ratio_per_core_vs_memory": one_worker["images_per_cpu_s"] / tf_memory["images_per_cpu_s"]}
    if per_call_samples:
        result["tensorflow_per_call"] = _best(per_call_samples)
        result["ratio_per_core_vs_per_call"] = (one_worker["images_per_cpu_s"]
                                                / result["tensorflow_per_call"]["images_per_cpu_s"])
    hosts = {r["workers"]: r for r in ours if not r["to_device"]}
    if 1 in hosts and 2 in hosts:
        result["scaling_2_workers_wall"] = hosts[2]["images_per_s"] / hosts[1]["images_per_s"]
    if breakdown:
        result["stages"] = breakdown
    if args.json == "-":
        print(json.dumps(result, indent=1))
        return 0
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    env = result["environment"]
    print(f"machine: {env['cpu']} ({env['cores']} cores, load average {env['load_average_1min']}); "
          f"best of {args.repeats} rounds")
    for r in ours:
        what = "global jax.Array batch" if r["to_device"] else "host numpy batch"
        print(f"(a) ours -> {what}, {r['workers']} worker(s): {r['images_per_s']:8.1f} images/s  "
              f"{r['images_per_cpu_s']:8.1f} images/cpu-s")
    print(f"(b) TF tf.data, records -> decode_and_crop_jpeg, 1 thread: {tf_best['images_per_s']:8.1f} images/s  "
          f"{tf_best['images_per_cpu_s']:8.1f} images/cpu-s")
    print(f"(b-mem) TF tf.data, JPEGs in memory, 1 thread:  {tf_memory['images_per_s']:8.1f} images/s  "
          f"{tf_memory['images_per_cpu_s']:8.1f} images/cpu-s")
    if per_call_samples:
        pc = result["tensorflow_per_call"]
        print(f"(b') TF, one tf.function call per image:     {pc['images_per_s']:8.1f} images/s  "
              f"{pc['images_per_cpu_s']:8.1f} images/cpu-s")
    print(f"(c) ratio per core (a: host batch, 1 worker)/(b): {result['ratio_per_core']:.2f}   "
          f"(vs b-mem: {result['ratio_per_core_vs_memory']:.2f}"
          + (f", vs b': {result['ratio_per_core_vs_per_call']:.2f})" if per_call_samples else ")"))
    if "scaling_2_workers_wall" in result:
        print(f"wall-clock scaling 1 -> 2 workers: {result['scaling_2_workers_wall']:.2f}x")
    if breakdown:
        for side in ("ours_ms", "tensorflow_ms"):
            for name, ms in breakdown.get(side, {}).items():
                print(f"  {side[:-3]:10s} {name:70s} {ms:6.3f} ms/image")
    return 0


if __name__ == "__main__":
    sys.exit(main())
