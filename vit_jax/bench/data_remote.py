"""`vit-jax bench data --remote`: the train iterator streaming from a bucket with per-request latency, against the
same dataset on local disk, in one run.

The bucket is a real GCS API server (gcp-storage-emulator) on localhost behind FaultProxy, which adds
`--latency-ms` (default 50) to every request, as a far-away bucket would. The dataset is the photographic JPEGs of
`vit-jax bench data`, prepared as an image-folder dataset in `--shards` files and uploaded as prepare-data does.
Both sides run the same train iterator (`decode_jpeg_and_inception_crop|flip_lr|value_range`, host numpy batches,
`--workers` decode threads); the bucket side streams with a `--window`-record shuffle window and one window of
read-ahead, so files keep being fetched during the timed steps (the dataset is read `steps x batch / images`
times per round). Rounds alternate local and bucket; the best round of each is reported, and their ratio.

The local side reads as a pod-size local split does: without the parsed-record cache that splits of at most
`sources.CACHE_BYTES` get (ImageNet-21k's 1.2 TB never would), unless `--local-cache`; this dataset is small only so
that the in-memory emulator can hold it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from vit_jax import cli_args


@contextlib.contextmanager
def _record_cache(enabled: bool):
    """The parsed-record cache of small local splits on (as configured) or off, while an iterator is built."""
    from vit_jax.data import sources

    saved = sources.CACHE_BYTES
    sources.CACHE_BYTES = saved if enabled else -1
    try:
        yield
    finally:
        sources.CACHE_BYTES = saved


def _cpu_s(pids: list[int]) -> float | None:
    """User + system CPU seconds of these processes so far (Linux /proc; None elsewhere)."""
    try:
        total = 0
        for pid in pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
        return total / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _rate(ds, size: int, batch: int, steps: int, workers: int, window: int, record_cache: bool,
          server_pids: list[int]) -> dict:
    import jax
    import numpy as np

    from vit_jax.data import pipeline
    from vit_jax.bench.data import PP

    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    with _record_cache(record_cache):
        it = pipeline.BatchIterator(ds, "train", PP.format(size=size), batch, sharding, train=True, seed=0,
                                    fraction=1.0, start_step=0, end_step=None, num_workers=workers, prefetch=2,
                                    to_device=False, stream=dict(window=window, read_ahead=1))
    try:
        for _ in range(3):  # warm-up: threads started, the first files fetched, batches in flight
            next(it)
        spool = getattr(it.plan, "records", None)
        fetched, waited = (spool.spool.files_fetched, spool.spool.wait_s) if spool else (0, 0.0)
        wall, cpu, server = time.perf_counter(), time.process_time(), _cpu_s(server_pids)
        for _ in range(steps):
            next(it)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        server_after = _cpu_s(server_pids)
        out = {"images": steps * batch, "images_per_s": steps * batch / wall, "cpu_s": cpu,
               "images_per_cpu_s": steps * batch / cpu,
               # The emulator and the proxy share this machine's cores; a real bucket's servers do not.
               "server_cpu_s": None if server is None or server_after is None else server_after - server,
               "record_cache": getattr(it.loader.source, "_cache", None) is not None}
        if spool:
            out.update(files_fetched_timed=spool.spool.files_fetched - fetched,
                       reader_wait_s=spool.spool.wait_s - waited)
        return out
    finally:
        it.close()


def _serve_proxy(upstream: str, latency_s: float, conn) -> None:
    from vit_jax.storage.emulator import FaultProxy

    with FaultProxy(upstream, latency_s=latency_s) as proxy:
        conn.send((proxy.url, os.getpid()))
        while conn.recv() == "count":
            conn.send(proxy.requests)


@contextlib.contextmanager
def _proxy_process(upstream: str, latency_s: float):
    """FaultProxy (the added latency) in a child process, yielding its URL, a request counter and its pid.

    The proxy is pure Python and relays every byte: in this process its CPU and GIL time counted as the pipeline's
    own (bucket / local 0.70-0.80 on a quiet machine, 2026-12-04), a cost a real bucket never puts on the host."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve_proxy, args=(upstream, latency_s, child), daemon=True)
    proc.start()
    try:
        url, pid = parent.recv()

        def requests() -> int:
            parent.send("count")
            return parent.recv()

        yield url, requests, pid
    finally:
        with contextlib.suppress(OSError):
            parent.send("stop")
        proc.join(10)
        if proc.is_alive():
            proc.terminate()


def _prepare(root: Path, jpegs: list[bytes], shards: int):
    """The JPEGs as an image-folder dataset in `shards` ArrayRecord files."""
    import tensorflow_datasets as tfds

    from vit_jax.data import datasets

    folder = root / "images" / "photo"
    folder.mkdir(parents=True)
    for i, data in enumerate(jpegs):
        (folder / f"{i:05d}.jpg").write_bytes(data)
    name, data_dir = f"folder:{folder.parent}", str(root / "tfds")
    builder = datasets.make_builder(name, data_dir, file_format="array_record")
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=shards))
    return datasets.open_dataset(name, data_dir=data_dir, prepare=False), data_dir


@contextlib.contextmanager
def _restored_env(value: str | None):
    try:
        yield
    finally:
        if value is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = value


def main(argv: list[str] | None = None) -> int:
    p = cli_args.ArgumentParser(prog="vit-jax bench data --remote", description=__doc__.split("\n\n")[0])
    p.add_argument("--num-images", type=int, default=512)
    p.add_argument("--shards", type=int, default=16, help="record files of the dataset")
    p.add_argument("--batch-size", dest="batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=64, help="batches timed per round")
    p.add_argument("--image-size", dest="size", type=int, default=224)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--window", type=int, default=128, help="records per shuffle window of the bucket stream")
    p.add_argument("--latency-ms", type=float, default=50.0, help="added to every request to the bucket")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--local-cache", action="store_true",
                   help="let the local side keep this small split parsed in memory (a pod-size split is not)")
    p.add_argument("--output", dest="json", default="", metavar="PATH", help="also write the result as JSON to PATH ('-': print)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)

    from vit_jax import runtime
    from vit_jax.data import datasets
    from vit_jax.bench.data import environment, make_jpegs
    from vit_jax.storage.emulator import Emulator

    jpegs = make_jpegs(args.num_images)
    saved = os.environ.get("STORAGE_EMULATOR_HOST")
    with tempfile.TemporaryDirectory() as tmp, Emulator(bucket="vit-jax-bench") as emulator, \
            _proxy_process(emulator.url, args.latency_ms / 1e3) as (proxy_url, proxy_requests, proxy_pid), \
            _restored_env(saved):
        os.environ["STORAGE_EMULATOR_HOST"] = proxy_url
        runtime.configure_storage_env()
        with contextlib.redirect_stdout(sys.stderr):  # keep --output output clean of build chatter
            local, data_dir = _prepare(Path(tmp), jpegs, args.shards)
            datasets.upload_prepared(local, data_dir, "gs://vit-jax-bench/tfds", progress=False)
        remote_ds = datasets.open_dataset(local.name, data_dir="gs://vit-jax-bench/tfds", prepare=False)
        rounds: dict[str, list[dict]] = {"local": [], "bucket": []}
        requests_before = proxy_requests()
        for _ in range(max(1, args.repeats)):
            for side, ds in (("local", local), ("bucket", remote_ds)):
                rounds[side].append(_rate(ds, args.size, args.batch, args.steps, args.workers, args.window,
                                          record_cache=args.local_cache,
                                          server_pids=[emulator.proc.pid, proxy_pid]))
        requests = proxy_requests() - requests_before
    best = {side: max(r, key=lambda x: x["images_per_s"]) for side, r in rounds.items()}
    result = {"environment": environment(), "latency_ms": args.latency_ms, "batch": args.batch,
              "images": args.num_images, "shards": args.shards, "window": args.window, "workers": args.workers,
              "steps": args.steps, "repeats": args.repeats, "bucket_requests": requests,
              "local_record_cache": args.local_cache,
              "local": best["local"], "bucket": best["bucket"],
              "rounds_images_per_s": {s: [round(x["images_per_s"], 1) for x in r] for s, r in rounds.items()},
              "ratio": best["bucket"]["images_per_s"] / best["local"]["images_per_s"],
              "ratio_per_cpu_s": best["bucket"]["images_per_cpu_s"] / best["local"]["images_per_cpu_s"]}
    if args.json == "-":
        print(json.dumps(result, indent=1))
        return 0
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
    env = result["environment"]
    print(f"machine: {env['cpu']} ({env['cores']} cores, load average {env['load_average_1min']}); best of "
          f"{args.repeats} rounds, batch {args.batch}, {args.workers} decode workers, {args.size} px")
    print(f"local disk:                    {best['local']['images_per_s']:8.1f} images/s "
          f"{best['local']['images_per_cpu_s']:8.1f} images/cpu-s "
          f"(parsed-record cache {'on' if args.local_cache else 'off, as for a pod-size split'})")
    print(f"bucket, {args.latency_ms:.0f} ms per request:     {best['bucket']['images_per_s']:8.1f} images/s "
          f"{best['bucket']['images_per_cpu_s']:8.1f} images/cpu-s "
          f"({best['bucket']['files_fetched_timed']} files fetched while timed; decode threads waited "
          f"{best['bucket']['reader_wait_s']:.2f} s for them)")
    if best["bucket"]["server_cpu_s"] is not None:
        print(f"the localhost emulator + proxy used {best['bucket']['server_cpu_s']:.2f} CPU-s of this machine in that "
              f"round (against {best['bucket']['cpu_s']:.2f} CPU-s of the pipeline's process)")
    print(f"ratio bucket / local: {result['ratio']:.2f} (wall), {result['ratio_per_cpu_s']:.2f} (per CPU-second); "
          f"{requests} requests to the bucket")
    return 0


if __name__ == "__main__":
    sys.exit(main())
