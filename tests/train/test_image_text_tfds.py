"""Image-text pairs from a TFDS dataset with a caption feature (#42 item 6), through configs/siglip.py's arguments
(dataset=, caption=, tokenizer=PATH) with the towers made tiny: a dataset of (image, caption string) built here by a
small local builder, a SentencePiece model trained on its captions, 2 steps of SigLIP with retrieval evaluation on
the validation split, and an exact resume from step 1 after the tokenizer's original file is gone (the run reads
its own copy). Several captions per image, stored as TFDS's coco_captions stores them, go through `choose_caption`
into the pipeline's batches."""

import shutil

import jax
import numpy as np
import pytest

from tests.launch.helpers import losses
from tests.train.helpers import ROOT, apply_overrides
from vit_jax.checkpoints.training import load_run_metadata, load_state_from_run
from vit_jax.data import text_ops
from vit_jax.train.config import config_module, validate
from vit_jax.train.trainer import Trainer

pytestmark = pytest.mark.slow

NAME = "vit_jax_test_pairs"
WORDS = ("red", "green", "blue", "dark", "bright", "square", "circle", "stripe")


def captioned_images(n: int, seed: int):
    rng = np.random.RandomState(seed)
    for i in range(n):
        yield i, {"image": rng.randint(0, 256, (16, 16, 3)).astype(np.uint8),
                  "caption": "a " + " ".join(rng.choice(WORDS, 3)) + "."}


def several_captions(n: int, seed: int):
    """Images with 2 to 4 captions each, as TFDS's coco_captions stores them: `captions` = [{text, id}, ...]."""
    rng = np.random.RandomState(seed)
    for i, ex in captioned_images(n, seed):
        texts = [ex["caption"], *(f"caption {k} of image {i}." for k in range(rng.randint(1, 4)))]
        yield i, {"image": ex["image"], "captions": [{"text": t, "id": 10 * i + k} for k, t in enumerate(texts)]}


def build_pairs(data_dir: str, name: str = NAME, several: bool = False) -> None:
    """A TFDS dataset of (image, caption) pairs: 64 train, 32 validation, as a user's own builder would write it
    (`several`: several captions per image)."""
    import tensorflow_datasets as tfds

    caption = {"captions": tfds.features.Sequence({"text": np.str_, "id": np.int64})} if several else {
        "caption": tfds.features.Text()}
    generate = several_captions if several else captioned_images

    class Pairs(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        VERSION = tfds.core.Version("1.0.0")
        code_path = url_infos = None  # nothing downloaded: no checksums file to look for beside the code

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
                {"image": tfds.features.Image(shape=(None, None, 3)), **caption}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(64, 0), "validation": self._generate_examples(32, 1)}

        def _generate_examples(self, n, seed):
            yield from generate(n, seed)

    Pairs.name = name
    Pairs(data_dir=data_dir, file_format="array_record").download_and_prepare()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    text_ops.forget_run_tokenizers()
    yield make_setup(tmp_path_factory.mktemp("pairs"))
    text_ops.forget_run_tokenizers()  # the runs here made the tokenizer's path mean their workdir's copy


def make_setup(root):
    """The pairs dataset, a SentencePiece model trained on its captions, and configs/siglip.py made tiny for them."""
    build_pairs(str(root / "tfds"))
    captions = [ex["caption"] for _, ex in captioned_images(64, 0)]
    tokenizer = text_ops.train_tokenizer(captions, str(root / "user" / "pairs"), 40)
    c = config_module(ROOT / "configs" / "siglip.py").get_config(
        f"dataset={NAME}:1.0.0,caption=caption,tokenizer={tokenizer}")
    c.data.data_dir = str(root / "tfds")
    small = lambda pp: pp.replace("resize(224)", "resize(16)").replace(", 64,", ", 8,")  # noqa: E731
    c = apply_overrides(c, {
        "model.variant": "", "model.width": 32, "model.depth": 1, "model.mlp_dim": 64, "model.num_heads": 2,
        "model.patch_size": 4, "model.image_size": 16, "model.dtype": "float32", "model.remat": "none",
        "siglip.embed_dim": 32, "siglip.text_vocab_size": 64, "siglip.text_max_len": 8, "siglip.text_width": 32,
        "siglip.text_depth": 1, "siglip.text_heads": 2, "siglip.text_mlp_dim": 64,
        "data.pp_train": small(c.data.pp_train), "data.pp_eval": small(c.data.pp_eval), "total_examples": 0,
        "total_steps": 2, "batch_size": 32, "log_every_steps": 1, "optimizer.warmup_steps": 1,
        "eval.every_steps": 2, "checkpoint.every_steps": 1})
    validate(c)
    return root, tokenizer, c


def test_pairs_from_a_tfds_caption_feature_train_evaluate_and_resume_exactly(setup, tmp_path):
    root, tokenizer, c = setup
    assert c.data.pp_train.endswith(f"tokenize('{tokenizer}', 8, key='caption', pad_id=1)")
    full = root / "run"
    trainer = Trainer(c, str(full))
    summary = trainer.train()
    assert summary["steps"] == 2 and summary["skipped_steps"] == 0
    final = summary["final"]
    assert final["eval/count"] == 32 and "eval/zeroshot_top1" not in final  # captions only: retrieval
    assert final["eval/i2t_recall@1"] <= final["eval/i2t_recall@5"] <= final["eval/i2t_recall@10"] <= 1.0
    assert load_run_metadata(str(full))["run_files"][text_ops.RUN_TOKENIZER]["tokenizer"] == tokenizer

    # Resume from step 1 in a new workdir holding that checkpoint and the run's tokenizer copy, with the user's
    # tokenizer file gone and a new process's view of names: step 2 sees the same batch and gives the same loss
    # and parameters, bit for bit.
    shutil.copytree(full / "checkpoints" / "1", tmp_path / "checkpoints" / "1")
    shutil.copy(full / text_ops.RUN_TOKENIZER, tmp_path / text_ops.RUN_TOKENIZER)
    shutil.rmtree(root / "user")
    text_ops.forget_run_tokenizers()
    resumed = Trainer(c, str(tmp_path))
    assert resumed.start_step == 1
    resumed.train()
    assert losses(tmp_path) == {2: losses(full)[2]}
    shapes = {"params": trainer.program.model.shapes}
    _, want = load_state_from_run(str(full), shapes)
    _, got = load_state_from_run(str(tmp_path), shapes)
    jax.tree.map(np.testing.assert_array_equal, got["params"], want["params"])


def test_several_captions_per_image_are_chosen_then_tokenized_into_batches(setup, tmp_path):
    """coco_captions' layout: `choose_caption` picks one caption per image (drawn with the op's random stream in
    training, so the same example and stream draw the same; the first in evaluation), which the batches carry as
    token ids; the captions themselves (strings) stay out of the batch."""
    from vit_jax.data import pipeline
    from vit_jax.data import pp as pp_lib
    from vit_jax.parallel import mesh as mesh_lib

    root, tokenizer, _ = setup
    build_pairs(str(tmp_path), "vit_jax_test_captions", several=True)
    ds = pipeline.open_dataset("vit_jax_test_captions", data_dir=str(tmp_path))
    pp_lib.load_modules(("vit_jax.data.text_ops",))
    tokens = f"tokenize('{tokenizer}', 8, key='caption')"
    train = pp_lib.build(f"decode|choose_caption()|{tokens}")
    first = pp_lib.build(f"decode|choose_caption(which='first')|{tokens}")
    tok = text_ops.load_tokenizer(tokenizer)
    source = ds.source("validation")
    for i in range(4):
        captions = [t.decode() for t in source[i]["captions"]["text"]]
        assert len(captions) >= 2
        chosen = first(source[i], np.random.default_rng(0))
        assert chosen["caption"].decode() == captions[0]
        np.testing.assert_array_equal(chosen["tokens"], tok([captions[0]], 8)[0])
        drawn = [train(source[i], np.random.default_rng(seed))["caption"].decode() for seed in range(12)]
        assert set(drawn) <= set(captions) and len(set(drawn)) > 1
        assert train(source[i], np.random.default_rng(5))["caption"] == train(source[i], np.random.default_rng(5))[
            "caption"]
    batch = next(iter(pipeline.eval_iterator(
        ds, "validation", f"decode|resize(16)|value_range(-1,1)|choose_caption(which='first')|{tokens}",
        global_batch_size=8, sharding=mesh_lib.batch_sharding(mesh_lib.make_mesh()))))
    assert batch["tokens"].shape == (8, 8) and "captions" not in batch and "caption" not in batch
    want = tok([t.decode() for i in range(8) for t in source[i]["captions"]["text"][:1]], 8)
    np.testing.assert_array_equal(np.asarray(batch["tokens"]), want)
    with pytest.raises(ValueError, match="choose 'random' \\(training\\) or 'first'"):
        pp_lib.build("choose_caption(which='any')")
