"""The prepare-data command: builds, resumes, verifies, and fails with a one-line message when data is missing."""

import json
from pathlib import Path

from vit_jax.commands import prepare_data as prepare
from vit_jax.data import imagenet21k


def test_prepare_digits_prints_split_and_class_counts(tmp_path, capsys):
    assert prepare.main(["digits", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "test: 360 examples, 10 of 10 classes present; 0=36" in out
    assert "train: 1437 examples, 10 of 10 classes present" in out
    counts = json.loads((tmp_path / "digits" / "1.0.0" / "class_counts.json").read_text())
    assert sum(counts["train"]["class_counts"].values()) == 1437
    # A second run finds the prepared data and only verifies it.
    assert prepare.main(["digits", "--data-dir", str(tmp_path)]) == 0
    assert "train: 1437 examples" in capsys.readouterr().out


def test_prepare_imagenet21k_folder_of_tars_reports_bad_images(tmp_path, gen, capsys):
    synsets = imagenet21k.fall11_synsets()[10:12]
    folder = tmp_path / "manual" / "fall11_whole"
    folder.mkdir(parents=True)
    for i, s in enumerate(synsets):
        files = gen.imagenet_synsets(1, 4, seed=i, synsets=[s])[s]
        if i == 0:
            files[f"{s}_bad.JPEG"] = gen.bad_images()["skipped_corrupt"]
        (folder / f"{s}.tar").write_bytes(gen.synset_tar_bytes(files))
    argv = ["imagenet21k/fall11_holdout1", "--data-dir", str(tmp_path / "tfds"), "--manual-dir",
            str(tmp_path / "manual"), "--workers", "2", "--show-classes", "1"]
    assert prepare.main(argv) == 0
    out = capsys.readouterr().out
    assert "build report" in out and "skipped_corrupt=1" in out and "kept=8" in out
    assert "validation: 2 examples, 2 of 21843 classes present; per class min=1 median=1 max=1" in out
    assert "train: 6 examples" in out
    report = json.loads(next(Path(tmp_path / "tfds").rglob("build_report.json")).read_text())
    assert report["files"]["skipped_corrupt"] == [f"{synsets[0]}/{synsets[0]}_bad.JPEG"]


def test_prepare_missing_data_is_a_one_line_error(tmp_path, capsys):
    from vit_jax import cli

    assert cli.main(["prepare-data", "imagenet21k/winter21", "--data-dir", str(tmp_path)]) == 2  # a usage error
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "winter21_whole.tar.gz" in err and "--manual-dir" in err


def test_prepare_imagenet21k_with_manual_dir_naming_the_archive(tmp_path, gen, capsys):
    # The README's command: --manual-dir /data/fall11_whole.tar (the archive itself, not its folder).
    synsets = imagenet21k.fall11_synsets()[20:22]
    tars = {f"{s}.tar": gen.synset_tar_bytes(gen.imagenet_synsets(1, 4, seed=i, synsets=[s])[s])
            for i, s in enumerate(synsets)}
    archive = tmp_path / "raw" / "fall11_whole.tar"
    archive.parent.mkdir()
    gen.write_tar(archive, tars)
    argv = ["imagenet21k/fall11_holdout1", "--data-dir", str(tmp_path / "tfds"), "--manual-dir", str(archive)]
    assert prepare.main(argv) == 0
    out = capsys.readouterr().out
    assert "train: 6 examples" in out and "validation: 2 examples" in out and "deleted the build's staging folder" in out
