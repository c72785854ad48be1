"""The `siglip` / `clip` objectives through the one trainer: a 2-step SigLIP run on the data x fsdp mesh (chunked
loss) that resumes bit for bit and reports zero-shot and retrieval figures, LiT's locked image tower bit-identical
after training, the caption and tokenizer ops, and the one-line config errors."""

import importlib.util
import shutil

import jax
import numpy as np
import pytest

from tests.launch.helpers import losses
from tests.train.helpers import ROOT, apply_overrides
from vit_jax.checkpoints.timm import save_timm
from vit_jax.checkpoints.training import load_state_from_run
from vit_jax.data import text_ops
from vit_jax.errors import ConfigError
from vit_jax.models.build import build_model
from vit_jax.models.config import ModelConfigError, vit_config
from vit_jax.train.config import validate
from vit_jax.train.objectives.image_text import retrieval_recalls
from vit_jax.train.trainer import Trainer

TINY = {"model.width": 32, "model.depth": 1, "model.mlp_dim": 64, "model.num_heads": 2, "siglip.embed_dim": 32,
        "siglip.text_width": 32, "siglip.text_depth": 1, "siglip.text_heads": 2, "siglip.text_mlp_dim": 64,
        "total_epochs": 0.0, "total_steps": 2, "batch_size": 32, "log_every_steps": 1,
        "optimizer.warmup_epochs": 0.0, "optimizer.warmup_steps": 1, "eval.every_epochs": 0.0,
        "eval.every_steps": 2, "checkpoint.every_epochs": 0.0, "checkpoint.every_steps": 1,
        "mesh.data": 4, "mesh.fsdp": 2}


@pytest.fixture(scope="module", autouse=True)
def tokenizer_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("VIT_JAX_CACHE", str(tmp_path_factory.mktemp("spm")))
    text_ops.forget_run_tokenizers()  # and the loaded ones
    yield
    mp.undo()
    text_ops.forget_run_tokenizers()  # the runs here made 'digits' mean their workdir's copy


def clip_config(data_dir, **overrides):
    spec = importlib.util.spec_from_file_location("demo_clip", ROOT / "configs" / "demo_clip.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config("siglip")
    c.data.data_dir = data_dir
    c = apply_overrides(c, {**TINY, **overrides})
    validate(c)
    return c


@pytest.fixture(scope="module")
def tower(tmp_path_factory):
    """A random classifier written as a timm state dict: LiT locks its tower, its classification head dropped."""
    cfg = vit_config(None, num_classes=10, image_size=16, patch_size=4, width=32, depth=1, mlp_dim=64, num_heads=2,
                     pool="token", posemb="learn")
    written = jax.tree.map(np.asarray, build_model(cfg).init(jax.random.key(3)))
    path = tmp_path_factory.mktemp("tower") / "tower.safetensors"
    save_timm(str(path), written, cfg)
    return path, {k: v for k, v in written.items() if k != "head"}


@pytest.fixture(scope="module")
def run(tmp_path_factory, digits_data_dir, tower):
    """One run serves every check (the suite's time): SigLIP with LiT's locked tower, 2 steps on data=4 x fsdp=2."""
    workdir = tmp_path_factory.mktemp("siglip") / "run"
    c = clip_config(digits_data_dir, **{"siglip.lock_image": str(tower[0]), "model.pool": "token"})
    trainer = Trainer(c, str(workdir))
    assert "img" not in trainer.state["params"]
    return workdir, trainer.train(), c, trainer


def test_a_siglip_run_on_the_data_x_fsdp_mesh_reports_zero_shot_and_retrieval(run):
    workdir, summary, _, _ = run
    assert summary["steps"] == 2 and summary["skipped_steps"] == 0
    final = summary["final"]
    assert final["eval/count"] == 360
    for key in ("eval/zeroshot_top1", "eval/i2t_recall@1", "eval/i2t_recall@5", "eval/t2i_recall@10"):
        assert 0.0 <= final[key] <= 1.0, key
    assert final["eval/i2t_recall@1"] <= final["eval/i2t_recall@5"] <= final["eval/i2t_recall@10"]
    assert np.isfinite(list(losses(workdir).values())).all()


def test_resume_is_bit_identical(run, tmp_path):
    full, _, c, _ = run
    shutil.copytree(full / "checkpoints" / "1", tmp_path / "checkpoints" / "1")
    trainer = Trainer(c, str(tmp_path))
    assert trainer.start_step == 1
    trainer.train()
    assert losses(tmp_path) == {2: losses(full)[2]}


def test_lit_leaves_the_locked_image_tower_bit_identical(run, tower):
    workdir, _, _, trainer = run
    shapes = {"params": trainer.program.model.shapes, "extra": jax.eval_shape(lambda: trainer.state["extra"])}
    _, first = load_state_from_run(str(workdir / "checkpoints" / "1"), shapes)
    _, last = load_state_from_run(str(workdir), shapes)
    jax.tree.map(np.testing.assert_array_equal, last["extra"]["img"], tower[1])
    assert not np.array_equal(first["params"]["txt"]["head"]["kernel"], last["params"]["txt"]["head"]["kernel"])


def test_captions_and_the_demo_tokenizer():
    rng = np.random.default_rng(0)
    held = text_ops.make_digit_caption("heldout")({"label": 7}, rng)["text"]
    assert any(held == t.format(n) for t in text_ops.HELDOUT_TEMPLATES for n in text_ops.DIGIT_NAMES[7])
    assert not set(text_ops.HELDOUT_TEMPLATES) & set(text_ops.TRAIN_TEMPLATES)
    tok = text_ops.load_tokenizer("digits")
    ids = tok(["a handwritten seven.", "a photo of the digit seven. " * 5], 16)
    assert ids.shape == (2, 16) and ids.dtype == np.int32
    assert ids[1, -1] == tok.eos_id  # cut: the end-of-text id is kept ("sticky")
    assert tok.eos_id in ids[0] and ids[0, -1] == 0  # short: end-of-text, then padding
    with pytest.raises(text_ops.TokenizerError, match="no SentencePiece model"):
        text_ops.Tokenizer("/nonexistent.model")


def test_retrieval_recall_counts_strictly_better_candidates():
    zimg = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    ztxt = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])  # image 1 and 2 each rank the other's caption first
    r = retrieval_recalls(zimg, ztxt)
    assert r["i2t_recall@1"] == pytest.approx(1 / 3) and r["i2t_recall@5"] == 1.0


def test_config_errors_are_one_line(digits_data_dir):
    with pytest.raises(ConfigError, match="micro_batches=2 would limit the negatives"):
        clip_config(digits_data_dir, micro_batches=2)
    with pytest.raises(ModelConfigError, match="text pool 'cls'"):
        clip_config(digits_data_dir, **{"siglip.text_pool": "cls"})


def test_the_run_converts_to_big_visions_siglip_npz_with_the_same_embeddings(run, tmp_path):
    """`vit-jax convert --to siglip` of the LiT run (its locked tower from the extra state, the trained text tower):
    the file read back gives the run's own image and text embeddings, temperature and bias."""
    from vit_jax.checkpoints.siglip_formats import load_siglip_npz
    from vit_jax.commands import convert

    workdir, _, c, trainer = run
    dst = str(tmp_path / "siglip.npz")
    assert convert.main(["--checkpoint", str(workdir), "--output", dst, "--to", "siglip"]) == 0
    spec, loaded = load_siglip_npz(dst)
    rng = np.random.RandomState(0)
    images = rng.uniform(-1, 1, (4, 16, 16, 3)).astype(np.float32)
    tokens = rng.randint(0, c.siglip.text_vocab_size, (4, c.siglip.text_max_len)).astype(np.int32)
    state = jax.device_get({"params": trainer.state["params"], "extra": trainer.state["extra"]})
    objective = trainer.program.objective
    want = jax.jit(objective.embed)(state["params"], state["extra"], images, tokens)

    @jax.jit
    def got(params):
        model = spec.model().bind(params)
        return (model.embed_image(images), model.embed_text(tokens), *model.scalars())

    for a, b in zip(want, got(loaded)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5)


def test_predict_writes_embeddings_and_zero_shot_logits_of_the_run_and_of_its_npz(run, tmp_path):
    """`vit-jax predict` of the run: image embeddings, and with --texts (the run's tokenizer) text embeddings and
    the logits exp(t) img.txt + b, all equal to the objective's own; of the converted .npz: the same image
    embeddings."""
    from vit_jax.commands import convert, predict

    workdir, _, c, trainer = run
    rng = np.random.RandomState(1)
    images = rng.uniform(-1, 1, (5, 16, 16, 3)).astype(np.float32)
    np.save(tmp_path / "images.npy", images)
    texts = ["a photo of the digit seven.", "a drawing of a 3.", "nought"]
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n\n")
    out = str(tmp_path / "emb.npy")
    assert predict.main(["--checkpoint", str(workdir), "--images", str(tmp_path / "images.npy"), "--output", out,
                         "--texts", str(tmp_path / "texts.txt"), "--batch-size", "4"]) == 0
    tokens = text_ops.load_tokenizer(c.siglip.tokenizer, c.siglip.pad_id)(texts, c.siglip.text_max_len)
    state = jax.device_get({"params": trainer.state["params"], "extra": trainer.state["extra"]})
    embed = jax.jit(trainer.program.objective.embed)
    zimg, _, t, b = embed(state["params"], state["extra"], images, np.repeat(tokens[:1], len(images), 0))
    _, ztxt, _, _ = embed(state["params"], state["extra"], images[:len(texts)], tokens)
    np.testing.assert_allclose(np.load(out), zimg, atol=1e-5)
    np.testing.assert_allclose(np.load(tmp_path / "emb_texts.npy"), ztxt, atol=1e-5)
    np.testing.assert_allclose(np.load(tmp_path / "emb_logits.npy"), t * np.asarray(zimg) @ np.asarray(ztxt).T + b,
                               atol=1e-4)
    npz, out2 = str(tmp_path / "siglip.npz"), str(tmp_path / "emb2.npy")
    assert convert.main(["--checkpoint", str(workdir), "--output", npz, "--to", "siglip"]) == 0
    assert predict.main(["--checkpoint", npz, "--images", str(tmp_path / "images.npy"), "--output", out2]) == 0
    np.testing.assert_allclose(np.load(out2), zimg, atol=1e-5)


def test_the_run_keeps_its_tokenizer_so_predict_and_eval_work_without_the_cache(run, tmp_path, monkeypatch):
    """The demo tokenizer is copied into the workdir when the run starts and recorded in its metadata; with the cache
    it came from gone (another machine, a cleaned home) and a new process's view, `vit-jax predict --texts` and
    `vit-jax eval` of the run read the workdir's copy: the run's own ids and figures, nothing retrained."""
    import hashlib
    import json

    from vit_jax.checkpoints.training import load_run_metadata
    from vit_jax.commands import eval as eval_command
    from vit_jax.commands import predict

    workdir, summary, c, trainer = run
    copy = workdir / text_ops.RUN_TOKENIZER
    assert load_run_metadata(str(workdir))["run_files"] == {
        text_ops.RUN_TOKENIZER: {"tokenizer": "digits", "sha256": hashlib.sha256(copy.read_bytes()).hexdigest()}}
    gone = tmp_path / "deleted_cache"
    monkeypatch.setenv("VIT_JAX_CACHE", str(gone))
    text_ops.forget_run_tokenizers()

    texts = ["a photo of the digit seven.", "nought"]
    (tmp_path / "texts.txt").write_text("\n".join(texts))
    np.save(tmp_path / "images.npy", np.zeros((2, 16, 16, 3), np.float32))
    out = str(tmp_path / "emb.npy")
    assert predict.main(["--checkpoint", str(workdir), "--images", str(tmp_path / "images.npy"), "--output", out,
                         "--texts", str(tmp_path / "texts.txt")]) == 0
    tokens = text_ops.Tokenizer(str(copy))(texts, c.siglip.text_max_len)
    state = jax.device_get({"params": trainer.state["params"], "extra": trainer.state["extra"]})
    _, ztxt, _, _ = jax.jit(trainer.program.objective.embed)(state["params"], state["extra"],
                                                             np.zeros((2, 16, 16, 3), np.float32), tokens)
    np.testing.assert_allclose(np.load(tmp_path / "emb_texts.npy"), ztxt, atol=1e-5)

    text_ops.forget_run_tokenizers()
    result = tmp_path / "eval.json"
    assert eval_command.main(["--checkpoint", str(workdir / "checkpoints" / "2"), "--output", str(result)]) == 0
    figures = json.loads(result.read_text())
    for key in ("eval/zeroshot_top1", "eval/i2t_recall@1", "eval/t2i_recall@5"):
        assert figures[key] == pytest.approx(summary["final"][key], abs=2 / 360), key  # another mesh: near-ties
    assert not gone.exists()  # nothing was trained into (or read from) a cache


def test_without_an_image_projection_the_image_features_are_the_embedding():
    """siglip.image_proj=False (big_vision's image out_dim=None): no `img_proj` parameters, so the run's .npz has no
    img/head and opens in open_clip and Hugging Face as it computes; embed_dim must then be the image width."""
    from vit_jax.train.objectives.image_text import SigLIP, SigLIPSettings

    cfg = vit_config(None, num_classes=0, image_size=16, patch_size=4, width=32, depth=1, mlp_dim=64, num_heads=2,
                     pool="map", posemb="learn")
    text = dict(text_vocab_size=64, text_max_len=8, text_width=32, text_depth=1, text_heads=2, text_mlp_dim=64)
    objective = SigLIP(cfg, SigLIPSettings(embed_dim=32, image_proj=False, **text))
    assert "img_proj" not in objective.model.shapes and "img_proj" in SigLIP(cfg, SigLIPSettings(
        embed_dim=32, **text)).model.shapes
    with pytest.raises(ModelConfigError, match="set embed_dim=32 \\(it is 16\\)"):
        SigLIP(cfg, SigLIPSettings(embed_dim=16, image_proj=False, **text)).model.shapes
