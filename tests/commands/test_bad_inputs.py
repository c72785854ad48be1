"""Every command fails well (#51): for each `vit-jax` command and the trainer, a table of bad inputs, each ending
with the documented exit status (2, a usage error), exactly one line on stderr that names the input, and nothing
written to the output path.

The commands run in this process (`vit_jax.cli.main`, stderr captured at the file descriptor), so the table costs
one import of each command, not a process start per row; every row fails before anything compiles. The rows that
need a real child process (the planner's worker) start it the way the command does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vit_jax import cli
from vit_jax.errors import DEBUG_ENV

# Files every row may name, made once (module fixture `files`): {name} in a row's argv is replaced by its path.
T = "{tmp}"
OUT = "{out}/result"  # the output path of every row, in a folder of its own: nothing may appear there
MISSING, NOTES, PICKLE, EMPTY = f"{T}/missing.npz", f"{T}/notes.txt", f"{T}/model.pth", f"{T}/empty"
VIT, RUN_DAMAGED, BLOCKED = f"{T}/vit.npz", f"{T}/damaged_run", f"{T}/afile/out.npz"  # BLOCKED: its parent is a file
IMAGES = f"{T}/images.npy"

# (command argv, text the one stderr line must contain). Ids say what is wrong.
ROWS: dict[str, tuple[list[str], str]] = {
    # convert
    "convert/unknown flag": (["convert", "--checkpoint", VIT, "--output", OUT, "--to", "timm", "--bogus"], "--bogus"),
    "convert/bad --to": (["convert", "--checkpoint", VIT, "--output", OUT, "--to", "onnx"], "onnx"),
    "convert/bad --image-size": (["convert", "--checkpoint", VIT, "--output", OUT, "--to", "timm",
                                  "--image-size", "big"], "big"),
    "convert/missing file": (["convert", "--checkpoint", MISSING, "--output", OUT, "--to", "timm"], "missing.npz"),
    "convert/wrong file type": (["convert", "--checkpoint", NOTES, "--output", OUT, "--to", "timm"], "notes.txt"),
    "convert/torch pickle": (["convert", "--checkpoint", PICKLE, "--output", OUT, "--to", "timm"], "model.pth"),
    "convert/not a run folder": (["convert", "--checkpoint", EMPTY, "--output", OUT, "--to", "timm"], "empty"),
    "convert/damaged run": (["convert", "--checkpoint", RUN_DAMAGED, "--output", OUT, "--to", "timm"], "truncated"),
    "convert/unwritable output": (["convert", "--checkpoint", VIT, "--output", BLOCKED, "--to", "timm"], "afile"),
    "convert/bad surgery": (["convert", "--checkpoint", VIT, "--output", OUT, "--to", "timm",
                             "--source-image-size", "64"], "64"),
    # predict
    "predict/unknown flag": (["predict", "--checkpoint", VIT, "--images", IMAGES, "--output", OUT, "--bogus"],
                             "--bogus"),
    "predict/bad --batch-size": (["predict", "--checkpoint", VIT, "--images", IMAGES, "--output", OUT,
                                  "--batch-size", "many"], "many"),
    "predict/bad --features": (["predict", "--checkpoint", VIT, "--images", IMAGES, "--output", OUT,
                                "--features", "pixels"], "pixels"),
    "predict/missing checkpoint": (["predict", "--checkpoint", MISSING, "--images", IMAGES, "--output", OUT],
                                   "missing.npz"),
    "predict/wrong checkpoint type": (["predict", "--checkpoint", NOTES, "--images", IMAGES, "--output", OUT],
                                      "notes.txt"),
    "predict/missing images": (["predict", "--checkpoint", VIT, "--images", f"{T}/nope.npy", "--output", OUT],
                               "nope.npy"),
    "predict/empty images folder": (["predict", "--checkpoint", VIT, "--images", EMPTY, "--output", OUT], "empty"),
    "predict/unwritable output": (["predict", "--checkpoint", VIT, "--images", IMAGES, "--output", BLOCKED], "afile"),
    "predict/top-k of features": (["predict", "--checkpoint", VIT, "--images", IMAGES, "--output", OUT,
                                   "--features", "tokens", "--top-k", "2"], "--top-k"),
    "predict/damaged run": (["predict", "--checkpoint", RUN_DAMAGED, "--images", IMAGES, "--output", OUT],
                            "truncated"),
    # eval
    "eval/unknown flag": (["eval", "--checkpoint", VIT, "--bogus"], "--bogus"),
    "eval/no checkpoint": (["eval"], "--checkpoint"),
    "eval/bad --batch-size": (["eval", "--checkpoint", VIT, "--batch-size", "x"], "'x'"),
    "eval/bad --l2-reg": (["eval", "--checkpoint", VIT, "--l2-reg", "strong"], "strong"),
    "eval/missing checkpoint": (["eval", "--checkpoint", MISSING, "--dataset", "digits"], "missing.npz"),
    "eval/wrong checkpoint type": (["eval", "--checkpoint", NOTES, "--dataset", "digits"], "notes.txt"),
    "eval/torch pickle": (["eval", "--checkpoint", PICKLE, "--dataset", "digits"], "model.pth"),
    "eval/unwritable output": (["eval", "--checkpoint", VIT, "--dataset", "digits", "--output", BLOCKED], "afile"),
    "eval/not a run folder": (["eval", "--checkpoint", EMPTY, "--dataset", "digits"], "empty"),
    # prepare-data
    "prepare-data/unknown flag": (["prepare-data", "digits", "--bogus"], "--bogus"),
    "prepare-data/no dataset": (["prepare-data"], "dataset"),
    "prepare-data/bad --workers": (["prepare-data", "digits", "--workers", "all"], "all"),
    "prepare-data/unknown dataset": (["prepare-data", "no_such_dataset_xyz", "--data-dir", OUT], "no_such_dataset_xyz"),
    "prepare-data/unwritable data dir": (["prepare-data", "digits", "--data-dir", f"{T}/afile/data"], "afile"),
    "prepare-data/bad --show-classes": (["prepare-data", "digits", "--show-classes", "many"], "many"),
    "prepare-data/unwritable, old spelling": (["prepare-data", "digits", "--data_dir", f"{T}/afile/d"], "afile"),
    "prepare-data/bad i21k release": (["prepare-data", "imagenet21k/spring99", "--data-dir", OUT], "spring99"),
    # sweep
    "sweep/unknown subcommand": (["sweep", "walk"], "walk"),
    "sweep/unknown flag": (["sweep", "status", NOTES, "--root", OUT, "--bogus"], "--bogus"),
    "sweep/missing config": (["sweep", "run", f"{T}/nope_sweep.py", "--root", OUT], "nope_sweep.py"),
    "sweep/wrong config type": (["sweep", "run", NOTES, "--root", OUT], "notes.txt"),
    "sweep/status of missing config": (["sweep", "status", f"{T}/nope_sweep.py", "--root", OUT], "nope_sweep.py"),
    "sweep/report of missing root": (["sweep", "report", f"{T}/noroot", "--output", OUT], "noroot"),
    "sweep/report unwritable": (["sweep", "report", f"{T}/noroot", "--output", BLOCKED], "afile"),
    "sweep/suggest without a report": (["sweep", "suggest", f"{T}/noroot", "--budget-exaflops", "1"], "noroot"),
    # analyze
    "analyze/unknown flag": (["analyze", "--checkpoint", VIT, "--what", "attention-distance", "--output", OUT,
                              "--bogus"], "--bogus"),
    "analyze/bad --what": (["analyze", "--checkpoint", VIT, "--what", "astrology", "--images", IMAGES,
                            "--output", OUT], "astrology"),
    "analyze/bad --max-images": (["analyze", "--checkpoint", VIT, "--what", "attention-distance", "--output", OUT,
                                  "--max-images", "lots"], "lots"),
    "analyze/missing checkpoint": (["analyze", "--checkpoint", MISSING, "--what", "attention-distance",
                                    "--images", IMAGES, "--output", OUT], "missing.npz"),
    "analyze/wrong checkpoint type": (["analyze", "--checkpoint", NOTES, "--what", "attention-distance",
                                       "--images", IMAGES, "--output", OUT], "notes.txt"),
    "analyze/missing images": (["analyze", "--checkpoint", VIT, "--what", "attention-distance",
                                "--images", f"{T}/nope.npy", "--output", OUT], "nope.npy"),
    "analyze/empty images folder": (["analyze", "--checkpoint", VIT, "--what", "attention-distance",
                                     "--images", EMPTY, "--output", OUT], "empty"),
    "analyze/unwritable output": (["analyze", "--checkpoint", VIT, "--what", "attention-distance",
                                   "--images", IMAGES, "--output", BLOCKED], "afile"),
    # bench
    "bench/unknown benchmark": (["bench", "sprint"], "sprint"),
    "bench/train unknown flag": (["bench", "train", "--bogus"], "--bogus"),
    "bench/train unknown variant": (["bench", "train", "--variant", "Z/99"], "Z/99"),
    "bench/train bad --mesh": (["bench", "train", "--variant", "Ti/16", "--mesh", "1,2"], "1,2"),
    "bench/train bad --dtype": (["bench", "train", "--dtype", "int3"], "int3"),
    "bench/train unwritable output": (["bench", "train", "--output", BLOCKED], "afile"),
    "bench/eval unknown flag": (["bench", "eval", "--bogus"], "--bogus"),
    "bench/data unknown flag": (["bench", "data", "--bogus"], "--bogus"),
    "bench/train --mesh -1,1,1 parses": (["bench", "train", "--mesh", "-1,1,1", "--variant", "Z/99"], "Z/99"),
    # plan
    "plan/unknown flag": (["plan", "--bogus"], "--bogus"),
    "plan/unknown variant": (["plan", "--variant", "Z/99"], "Z/99"),
    "plan/--mesh -1,1,1 parses": (["plan", "--mesh", "-1,1,1", "--variant", "Z/99"], "Z/99"),
    "plan/bad topology": (["plan", "--topology", "v9:1x1"], "v9:1x1"),
    "plan/mesh does not divide": (["plan", "--devices", "4", "--mesh", "1,3,1"], "1,3,1"),
    "plan/unknown accelerator": (["plan", "--accelerator", "abacus", "--suggest"], "abacus"),
    "plan/suggest without memory": (["plan", "--suggest"], "--suggest"),
    "plan/compiler without topology": (["plan", "--compiler", "tpu"], "--compiler"),
    "plan/unwritable output": (["plan", "--output", BLOCKED], "afile"),
    # the worker's own error: relative positions with class-token pooling (the case), in the worker process
    "plan/invalid model in the worker": (["plan", "--variant", "B/16", "--image-size", "1024", "--rel-pos",
                                          "--batch-size", "4", "--topology", "v5e:2x2"], "rel_pos"),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("bad_inputs")
    (tmp / "notes.txt").write_text("not a checkpoint\n")
    (tmp / "model.pth").write_bytes(b"PK\x03\x04 pretend torch zip")
    (tmp / "empty").mkdir()
    (tmp / "afile").write_text("a file where a folder is expected\n")
    _save_tiny_vit(tmp / "vit.npz")
    np.save(tmp / "images.npy", np.zeros((2, 16, 16, 3), np.float32))
    _save_damaged_run(tmp / "damaged_run")
    return tmp


def _tiny_vit():
    import jax

    from vit_jax.models.config import ViTConfig
    from vit_jax.models.vit import FunctionalViT

    cfg = ViTConfig(image_size=(16, 16), patch_size=(8, 8), width=32, depth=1, mlp_dim=64, num_heads=2, num_classes=3)
    return cfg, FunctionalViT(cfg).init(jax.random.key(0))


def _save_tiny_vit(path: Path) -> None:
    from vit_jax.checkpoints.npz import save_npz_params

    cfg, params = _tiny_vit()
    save_npz_params(str(path), params, cfg)


def _save_damaged_run(workdir: Path) -> None:
    """A run of the tiny ViT whose largest state file is cut short."""
    import jax

    from vit_jax.checkpoints.training import RunCheckpointer, model_meta
    from vit_jax.models.build import family_of

    cfg, params = _tiny_vit()
    ckpt = RunCheckpointer(str(workdir / "checkpoints"), keep=1, async_save=False)
    ckpt.save(1, {"params": jax.tree.map(np.asarray, params)}, {"step": 1},
              {"model": model_meta(cfg), "model_family": family_of(cfg).name})
    ckpt.close()
    largest = max((p for p in (workdir / "checkpoints" / "1" / "state").rglob("*") if p.is_file()),
                  key=lambda p: p.stat().st_size)
    largest.write_bytes(largest.read_bytes()[:64])


def _run(argv: list[str], capfd) -> tuple[int, str, str]:
    capfd.readouterr()
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capfd.readouterr()
    return code, out, err


@pytest.mark.parametrize("row", list(ROWS))
def test_a_bad_input_is_one_line_naming_it_and_exit_2(row, files, capfd, monkeypatch, tmp_path):
    monkeypatch.setenv(DEBUG_ENV, "0")
    monkeypatch.chdir(Path(__file__).parents[2])  # configs/ is relative to the repository
    argv, named = ROWS[row]
    argv = [a.replace(T, str(files)).replace("{out}", str(tmp_path / "out")) for a in argv]
    code, out, err = _run(argv, capfd)
    lines = err.strip().splitlines()
    assert code == 2, (row, code, err[-2000:])
    assert len(lines) == 1 and named in lines[0], (row, lines)
    assert not (tmp_path / "out").exists(), (row, list((tmp_path / "out").rglob("*")))


def test_a_timm_checkpoint_of_an_unknown_family_says_what_it_is_in_one_line(files, capfd, tmp_path):
    """The issue's case: a timm ConvNeXt state dict (random weights, timm itself) given to predict."""
    from tests.interop import require_timm

    timm = require_timm()
    from safetensors.torch import save_file

    path = tmp_path / "convnext.safetensors"
    save_file({k: v.contiguous() for k, v in timm.create_model("convnext_atto", num_classes=3).state_dict().items()},
              str(path))
    code, _, err = _run(["predict", "--checkpoint", str(path), "--images", str(files / "images.npy"),
                         "--output", str(tmp_path / "out" / "logits.npy")], capfd)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert "convnext.safetensors: a safetensors state dict" in lines[0] and "stages.0.blocks.0.conv_dw" in lines[0]
    assert "nearest known family: BiT" in lines[0] and "vit-jax reads: " in lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("how", ["--verbose", DEBUG_ENV])
def test_verbose_still_shows_the_traceback(how, files, capfd, monkeypatch, tmp_path):
    monkeypatch.setenv(DEBUG_ENV, "1" if how == DEBUG_ENV else "0")  # restored after the test (--verbose sets it)
    flag = ["--verbose"] if how == "--verbose" else []
    code, _, err = _run([*flag, "convert", "--checkpoint", str(files / "notes.txt"), "--output",
                         str(tmp_path / "o.npz"), "--to", "timm"], capfd)
    assert code == 2 and "Traceback" in err and "UnrecognisedCheckpointError" in err
    assert err.strip().splitlines()[-1].startswith("vit-jax convert: error: ")


# The trainer parses its flags with absl, which keeps flag values between calls in one process: each row is its own
# process (all started at once; each ends in about 2 s of CPU, before JAX starts).
TRAIN = ["-m", "vit_jax.main", "--config=configs/demo.py", f"--workdir={OUT}"]
TRAIN_ROWS: dict[str, tuple[list[str], str]] = {
    "no config": (["-m", "vit_jax.main", f"--workdir={OUT}"], "--config"),
    "no workdir": (["-m", "vit_jax.main", "--config=configs/demo.py"], "--workdir"),
    "missing config": (["-m", "vit_jax.main", f"--config={T}/nope_config.py", f"--workdir={OUT}"], "nope_config.py"),
    "wrong config type": (["-m", "vit_jax.main", f"--config={NOTES}", f"--workdir={OUT}"], "notes.txt"),
    "unknown flag": ([*TRAIN, "--bogus=1"], "bogus"),
    "unknown config key": ([*TRAIN, "--config.modle.width=8"], "modle"),
    "bad config value": ([*TRAIN, "--config.batch_size=many"], "many"),
    "unknown variant": ([*TRAIN, "--config.model.variant=Z/99"], "Z/99"),
    "invalid model combination": ([*TRAIN, "--config.model.rel_pos=True", "--config.model.pool=token"], "rel_pos"),
    "unknown attention kernel": ([*TRAIN, "--config.model.attention=flash"], "flash"),
}


def test_the_trainer_fails_well_on_each_bad_input(files, tmp_path):
    import os
    import subprocess
    import sys

    root = Path(__file__).parents[2]
    env = {**os.environ, DEBUG_ENV: "0", "JAX_PLATFORMS": "cpu"}
    procs = {}
    for row, (argv, named) in TRAIN_ROWS.items():
        out = tmp_path / row.replace(" ", "_")
        argv = [a.replace(T, str(files)).replace("{out}", str(out)) for a in argv]
        procs[row] = (subprocess.Popen([sys.executable, *argv], cwd=root, env=env, text=True, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE), named, out)
    for row, (proc, named, out) in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        lines = stderr.strip().splitlines()
        assert proc.returncode == 2, (row, proc.returncode, stderr[-2000:])
        assert len(lines) == 1 and named in lines[0] and lines[0].startswith("vit-jax train: error: "), (row, lines)
        assert not out.exists(), (row, list(out.rglob("*")))
