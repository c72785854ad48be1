"""`vit-jax prepare-data DATASET`: build a dataset's TFDS files, then verify them.

Examples:
  vit-jax prepare-data digits
  vit-jax prepare-data imagenet21k/fall11 --data-dir /data/tfds --manual-dir /data/raw
  vit-jax prepare-data folder:/data/my_photos
  vit-jax prepare-data cifar10 --download          # the only way anything is fetched from the network
  vit-jax prepare-data digits --data-dir gs://bucket/tfds

A bucket data_dir (gs://...): the dataset is built and verified in a local staging folder (--staging-dir, default
~/.cache/vit_jax/staging/<url>: it needs the dataset's size on local disk), then uploaded file by file with a
progress bar; files already in the bucket with the same size are skipped, so rerunning after a crash resumes.
features.json and dataset_info.json go last: until they are there, no reader takes the dataset as prepared. The
staging folder is deleted after the upload (--keep-staging keeps it).

Interrupted builds resume: finished per-synset / per-class units are recorded in <data_dir>/downloads/ and
skipped (that staging folder is small, and deleted once the build succeeds).
The verification pass reads every record's label and prints per-split counts and class counts (all classes
when there are at most --show-classes of them, a summary otherwise; full counts go to class_counts.json).
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import sys
from pathlib import Path

from vit_jax import cli_args
from vit_jax.data import datasets
from vit_jax.storage.remote import StorageError


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = cli_args.ArgumentParser(prog="vit-jax prepare-data", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("dataset",
                   help="digits | digits_mosaic | imagenet21k[/fall11|/winter21] | folder:/abs/path | a TFDS name")
    p.add_argument("--data-dir", default=None, type=cli_args.output_path,
                   help="TFDS data dir (default: $TFDS_DATA_DIR or ~/tensorflow_datasets)")
    p.add_argument("--manual-dir", default=None,
                   help="where manual files are, or the imagenet21k archive (default: <data_dir>/downloads/manual)")
    p.add_argument("--download", action="store_true", help="allow TFDS to download the data (network)")
    p.add_argument("--workers", type=int, default=None, help="image-checking threads (default: all cores)")
    p.add_argument("--no-verify", action="store_true", help="skip the verification pass")
    p.add_argument("--show-classes", type=int, default=20, help="print every class count up to this many classes")
    p.add_argument("--staging-dir", default=None, help="bucket data_dir: where to build before uploading")
    p.add_argument("--keep-staging", action="store_true", help="bucket data_dir: keep the local build after upload")
    return p.parse_args(argv)


def verify(ds: datasets.Dataset, show_classes: int = 20) -> dict:
    """Reads every record's label; returns {split: {"examples": n, "class_counts": {...}}} and prints a summary."""
    from tqdm import tqdm

    summary = {}
    for split in ds.splits:
        src = ds.source(split)
        counts: collections.Counter[int] = collections.Counter()
        for i in tqdm(range(len(src)), desc=f"verify {split}", unit="ex", leave=False):
            counts[int(src[i].get("label", -1))] += 1
        expected = ds.num_examples(split)
        if sum(counts.values()) != expected:
            raise RuntimeError(f"{ds.name}/{split}: read {sum(counts.values())} records, dataset_info says {expected}")
        summary[split] = {"examples": expected, "class_counts": dict(sorted(counts.items()))}
        names = ds.class_names
        line = f"{split}: {expected} examples, {len(counts)} of {ds.num_classes} classes present"
        if ds.num_classes and len(counts) <= show_classes:
            line += "; " + ", ".join(f"{names[c] if 0 <= c < len(names) else c}={n}" for c, n in sorted(counts.items()))
        elif counts:
            values = sorted(counts.values())
            line += f"; per class min={values[0]} median={values[len(values) // 2]} max={values[-1]}"
        print(line)
    out = Path(ds.builder.data_dir) / "class_counts.json"
    try:
        out.write_text(json.dumps(summary))
    except OSError:  # a read-only data dir is fine to verify
        pass
    return summary


def prepare_in_bucket(args: argparse.Namespace) -> datasets.Dataset:
    """Builds and verifies locally, uploads (resuming), returns the dataset as read from the bucket."""
    url = args.data_dir.rstrip("/")
    try:
        ds = datasets.open_dataset(args.dataset, data_dir=url, prepare=False)
        print(f"{args.dataset} is prepared in {url} already")
        return ds
    except datasets.DataNotFoundError:
        pass
    staging = args.staging_dir or datasets.default_staging_dir(url)
    local = datasets.open_dataset(args.dataset, data_dir=staging, manual_dir=args.manual_dir, prepare=True,
                                  download=args.download, num_workers=args.workers, show_build=True)
    if not args.no_verify:
        verify(local, args.show_classes)  # before the upload, from local disk (class_counts.json goes up too)
    datasets.upload_prepared(local, staging, url)
    if not args.keep_staging:
        shutil.rmtree(staging, ignore_errors=True)
        print(f"deleted the staging folder {staging}")
    return datasets.open_dataset(args.dataset, data_dir=url, prepare=False)


def main(argv: list[str] | None = None) -> int:
    """Prepares (if needed) and verifies one dataset; returns a process exit code."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    in_bucket = bool(args.data_dir) and datasets.is_url(args.data_dir)
    try:
        if in_bucket:
            ds = prepare_in_bucket(args)
        else:
            ds = datasets.open_dataset(args.dataset, data_dir=args.data_dir, manual_dir=args.manual_dir,
                                       prepare=True, download=args.download, num_workers=args.workers,
                                       show_build=True)
        print(json.dumps(ds.description(), indent=1))
    except StorageError as e:  # a bucket that failed (a DataNotFoundError is a usage error: `vit-jax` reports it)
        print(f"prepare-data: {e}", file=sys.stderr)
        return 1
    if not (args.no_verify or in_bucket):  # a bucket's copy was verified before its upload
        verify(ds, args.show_classes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
