"""Text for image-text training: generated captions of the digits, SentencePiece tokenizers, and their ops.

A config that trains on image-text pairs names this module in `data.pp_modules` (("vit_jax.data.text_ops",)):
- `digit_caption(templates='train')`: example["text"] = a caption of the example's digit, one of the templates of
  that set with one of the class's names, drawn with the op's random stream (so a resumed run draws the same);
  `templates='heldout'` draws from templates never used in training (the zero-shot evaluation's).
- `choose_caption(key='captions', field='text', out='caption', which='random')`: example[out] = one caption of an
  image that has several (TFDS's coco_captions: `captions` a sequence of {text, id}; or a sequence of strings),
  drawn with the op's random stream in training (a resumed run draws the same) or the first (`which='first'`, for
  evaluation: the same pairs every time).
- `tokenize(model, max_len, key='text', out='tokens', pad_id=0)`: example[out] = int32 (max_len,) ids of
  example[key] by the SentencePiece model at `model` (a path, or 'digits': the demo's own, see below), the end-of-
  text id appended and kept when the text is cut ("sticky" EOS, as big_vision's SigLIP), then padded.

The demo's tokenizer is trained by the project from the captions of the training templates only (sentencepiece's
trainer, single-threaded so its output is the same on every machine) and cached under $VIT_JAX_CACHE (default
~/.cache/vit_jax), keyed by a hash of its inputs; words of the held-out templates are split into pieces it knows
(character coverage 1.0).

A run keeps its tokenizer: `keep_tokenizer_with_run` copies the model a config names ('digits' or a path) into the
run's workdir (RUN_TOKENIZER) when the run first starts, and from then on that name means the workdir's copy in this
process (the `tokenize` ops and the zero-shot prompts alike), for the run, its resumptions and `vit-jax eval` /
`predict` of it: the run does not depend on the cache or on the original file staying where it was, or unchanged.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from vit_jax.data.pp import Example, Op, register
from vit_jax.errors import UserError

# Several names per class (paraphrases): a caption names its digit one of these ways.
DIGIT_NAMES = (("zero", "0", "nought"), ("one", "1", "a single"), ("two", "2", "a pair"), ("three", "3", "a trio"),
               ("four", "4", "a quartet"), ("five", "5", "a quintet"), ("six", "6", "half a dozen"),
               ("seven", "7", "a septet"), ("eight", "8", "an octet"), ("nine", "9", "a nonet"))
TRAIN_TEMPLATES = ("a photo of the digit {}.", "a handwritten {}.", "the number {} written by hand.",
                   "a scan of a {}.", "an image of the number {}.", "digit: {}", "{} in ink.",
                   "a small grayscale {}.", "someone wrote {}.", "the figure {} on paper.")
# Never seen in training: the zero-shot evaluation's prompts (class names x these templates, embeddings averaged).
HELDOUT_TEMPLATES = ("a picture showing {}.", "this is the handwritten numeral {}.", "a blurry drawing of {}.",
                     "look, it is {}!")
TEMPLATE_SETS = {"train": TRAIN_TEMPLATES, "heldout": HELDOUT_TEMPLATES}
DEMO_VOCAB = 256
DIGITS_TOKENIZER = "digits"
RUN_TOKENIZER = "tokenizer.model"  # the run's copy of its tokenizer, in its workdir

# The tokenizer of the run this process trains or evaluates: the name its config gives ('digits', a path) -> the
# copy in the run's workdir. Set (keep_tokenizer_with_run) before the run's ops and prompts are built.
_run_copies: dict[str, str] = {}


class TokenizerError(UserError, ValueError):
    """A SentencePiece model cannot be found, read or trained."""


def digit_prompts(templates: Sequence[str] = HELDOUT_TEMPLATES) -> list[list[str]]:
    """The zero-shot prompts: for every class, its first name in every template."""
    return [[t.format(names[0]) for t in templates] for names in DIGIT_NAMES]


def training_captions() -> list[str]:
    """Every caption the training templates can make (what the demo's tokenizer learns from)."""
    return [t.format(n) for t in TRAIN_TEMPLATES for names in DIGIT_NAMES for n in names]


def train_tokenizer(sentences: Sequence[str], prefix: str, vocab_size: int) -> str:
    """Trains a SentencePiece unigram model on `sentences`; writes PREFIX.model and returns its path. Ids: pad 0,
    unk 1, eos 2, no bos."""
    import sentencepiece as spm

    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size,
                                       model_type="unigram", character_coverage=1.0, pad_id=0, unk_id=1, bos_id=-1,
                                       eos_id=2, num_threads=1, hard_vocab_limit=False, minloglevel=2)
    except RuntimeError as e:
        raise TokenizerError(f"sentencepiece could not train a tokenizer: {str(e).splitlines()[0]}") from e
    path = f"{prefix}.model"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    Path(tmp).write_bytes(model.getvalue())
    os.replace(tmp, path)  # atomic: concurrent processes may train it at once
    return path


def digits_tokenizer_path(cache_dir: str | None = None) -> str:
    """The demo tokenizer's file, trained on first use into `cache_dir` (default ~/.cache/vit_jax)."""
    sentences = training_captions()
    digest = hashlib.sha256("\n".join([str(DEMO_VOCAB), *sentences]).encode()).hexdigest()[:12]
    root = Path(cache_dir or os.environ.get("VIT_JAX_CACHE", Path.home() / ".cache" / "vit_jax"))
    path = root / f"digits_captions_spm_{digest}.model"
    if not path.exists():
        train_tokenizer(sentences, str(path)[:-len(".model")], DEMO_VOCAB)
    return str(path)


def tokenizer_source(name: str) -> str:
    """Where the model a config names is outside any run: 'digits' -> the demo's (trained on first use), else the
    path itself."""
    return digits_tokenizer_path() if name == DIGITS_TOKENIZER else name


def _model_bytes(path: str) -> bytes:
    """The file's bytes (local or a bucket: sentencepiece itself reads local files only)."""
    from etils import epath

    file = epath.Path(path)
    if not file.is_file():
        raise TokenizerError(f"no SentencePiece model at {path}: give the path of a .model file (or 'digits')")
    return file.read_bytes()


def keep_tokenizer_with_run(name: str, run_dir: str, write: bool) -> dict[str, dict[str, str]]:
    """Makes `name` ('digits' or a path; '' = none) mean the run's own copy, RUN_DIR/tokenizer.model, in this process,
    and returns what the run's metadata records of it ({RUN_TOKENIZER: {tokenizer, sha256}}; {} without one).

    A copy already there is the run's (a resumption, an evaluation) and is used as it is. Otherwise, with `write`
    (the process that writes the run's files), the source is copied there first; without (an evaluation of an older
    run, or another process of a multi-process run before process 0 wrote the copy) the source is used: the same
    bytes."""
    from etils import epath

    if not name:
        return {}
    copy = epath.Path(run_dir) / RUN_TOKENIZER
    if copy.exists():
        used = str(copy)
    else:
        used = tokenizer_source(name)
        if write:
            data = _model_bytes(used)
            tmp = copy.with_name(f"{RUN_TOKENIZER}.tmp{os.getpid()}")
            tmp.write_bytes(data)
            tmp.rename(copy)  # whole or absent: a reader never sees half a model
            used = str(copy)
    _run_copies[name] = used
    load_tokenizer.cache_clear()  # ops and prompts built from now on read `used`
    if used != str(copy):
        return {}
    return {RUN_TOKENIZER: {"tokenizer": name, "sha256": hashlib.sha256(_model_bytes(used)).hexdigest()}}


def forget_run_tokenizers() -> None:
    """Names mean their sources again (a new process's view; tests)."""
    _run_copies.clear()
    load_tokenizer.cache_clear()


class Tokenizer:
    """A SentencePiece model: texts -> fixed-length int32 ids with a sticky end-of-text id."""

    def __init__(self, path: str, pad_id: int = 0):
        import sentencepiece as spm

        path = _run_copies.get(path) or tokenizer_source(path)
        data = _model_bytes(path)
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(data)
        except (OSError, RuntimeError) as e:
            raise TokenizerError(f"{path} is not a SentencePiece model ({str(e).splitlines()[0]})") from e
        self.path, self.pad_id = path, pad_id
        self.eos_id = self.sp.eos_id() if self.sp.eos_id() >= 0 else self.sp.piece_to_id("</s>")
        self.vocab_size = self.sp.get_piece_size()

    def __call__(self, texts: Sequence[str], max_len: int) -> np.ndarray:
        out = np.full((len(texts), max_len), self.pad_id, np.int32)
        for i, ids in enumerate(self.sp.encode(list(texts))):
            ids = [*ids[:max_len - 1], self.eos_id]
            out[i, :len(ids)] = ids
        return out


@functools.lru_cache(maxsize=8)
def load_tokenizer(path: str, pad_id: int = 0) -> Tokenizer:
    return Tokenizer(path, pad_id)


@register("digit_caption")
def make_digit_caption(templates: str = "train", key: str = "label", out: str = "text") -> Op:
    """example[out] = a caption of the digit example[key] from the template set `templates` (train | heldout)."""
    if templates not in TEMPLATE_SETS:
        raise ValueError(f"digit_caption(templates='{templates}'): choose {' or '.join(TEMPLATE_SETS)}")
    chosen = TEMPLATE_SETS[templates]

    def op(ex: Example, rng: np.random.Generator) -> Example:
        names = DIGIT_NAMES[int(ex[key])]
        return {**ex, out: chosen[rng.integers(len(chosen))].format(names[rng.integers(len(names))])}

    return op


CAPTION_CHOICES = ("random", "first")


@register("choose_caption")
def make_choose_caption(key: str = "captions", field: str = "text", out: str = "caption", which: str = "random") -> Op:
    """example[out] = one of example[key]'s captions (strings, or dicts holding one under `field`): at random with the
    op's stream (`which='random'`) or the first (`which='first'`)."""
    if which not in CAPTION_CHOICES:
        raise ValueError(f"choose_caption(which='{which}'): choose 'random' (training) or 'first' (evaluation)")

    def op(ex: Example, rng: np.random.Generator) -> Example:
        if key not in ex:
            raise ValueError(f"choose_caption: the example has no '{key}' feature (it has {', '.join(sorted(ex))})")
        value = ex[key]
        texts = list(np.asarray(value[field] if isinstance(value, dict) else value, dtype=object).reshape(-1))
        if not texts:
            raise ValueError(f"choose_caption: an example has no captions in '{key}'")
        return {**ex, out: texts[int(rng.integers(len(texts)))] if which == "random" else texts[0]}

    return op


@register("tokenize")
def make_tokenize(model: str = DIGITS_TOKENIZER, max_len: int = 16, key: str = "text", out: str = "tokens",
                  pad_id: int = 0) -> Op:
    """example[out] = int32 (max_len,) SentencePiece ids of example[key] (sticky EOS, then `pad_id`)."""
    tokenizer = load_tokenizer(model, pad_id)

    def op(ex: Example, rng: np.random.Generator) -> Example:
        text = ex[key]
        text = text.decode() if isinstance(text, (bytes, np.bytes_)) else str(text)
        return {**ex, out: tokenizer([text], max_len)[0]}

    return op
