"""SigLIP pretraining of both towers (Zhai et al. 2023, "Sigmoid Loss for Language Image Pre-Training").

    python -m vit_jax.main --config=configs/siglip.py:dataset=NAME,caption=FEATURE,tokenizer=PATH --workdir=...
    args: dataset= a TFDS image-text dataset (name[/config][:version], built or prepared under data.data_dir) whose
          examples hold an `image` and a caption string feature; caption= that feature's name (default `caption`);
          tokenizer= the SentencePiece .model of the text tower (big_vision's SigLIP B/16 uses a 32k model trained
          on English C4); eval_split= (default `validation`); examples= examples seen (default 9B); batch= (32768)

The recipe (the paper's, for its B/16 models):
- Image tower ViT-B/16 at 224 px with a MAP head (attention pooling, no class token), learned position embeddings;
  text tower: a B-sized bidirectional Transformer (12 blocks, width 768, 12 heads, MLP 3072) over 64 SentencePiece
  tokens (32k vocabulary; the released B/16 checkpoints' length: the paper's batch-size study kept 16), pooled at
  the last token, both projected to 768 and L2-normalised.
- Sigmoid loss over every pair of the global batch, t' = log 10 and b = -10 at init (§3.2, Algorithm 1), chunked:
  each device passes its texts round the ring of devices (§3.3, Fig. 1).
- Batch 32k (the paper's §4: beyond 32k the gains vanish), AdamW with lr 1e-3 and weight decay 1e-4, beta2 0.95
  instead of 0.999 (the paper's large-batch stabilisation), cosine decay. The warmup (5k steps here) is our choice.
- Examples seen: 9B by default, one of the paper's budgets for B/16 (docs/image_text.md quotes the ImageNet
  zero-shot figure it corresponds to); set examples= for another.

WebLI, the paper's data, is not public: the dataset is the user's. Zero-shot classification needs class names this
objective knows only for the digits, so evaluation here is image<->text retrieval on the eval split's pairs.

Target topology (TARGETS below; compiled by the TPU compiler in benchmarks/preflight_configs.py, table in
docs/BENCHMARKS.md): the B/16 run on 128 TPU v3 cores, v3-128 (v3:8x8), 256 examples per core:
`vit-jax plan --topology v3:8x8 --config configs/siglip.py` (docs/image_text.md has its result: it fits, 5.65 GiB
peak per 16 GiB core with both towers fully rematerialised; roofline 709 ms/step, compute-bound).
"""

import re

from vit_jax.errors import ConfigError
from vit_jax.train.config import default_config, parse_config_args

TARGETS = {"": "v3:8x8"}
# A TFDS dataset name as `tfds.builder` takes it: name, optional /config, optional :version.
TFDS_NAME = re.compile(r"^[a-z][a-z0-9_]*(/[\w.-]+)?(:\d+\.\d+\.\d+)?$")
FEATURE = re.compile(r"^[A-Za-z_][\w/]*$")
DEFAULTS = {"dataset": "", "caption": "caption", "tokenizer": "", "eval_split": "validation",
            "examples": "9e9", "batch": "32768"}


def data_args(a: dict[str, str], config_name: str) -> None:
    """Validates the dataset, caption feature and tokenizer arguments (one line per mistake). An empty dataset is
    allowed so the run can be planned and built without data; training then says what to set."""
    if a["dataset"] and not TFDS_NAME.match(a["dataset"]):
        raise ConfigError(f"configs/{config_name}:dataset={a['dataset']!r} is not a TFDS dataset name "
                          "(name[/config][:x.y.z], e.g. coco_captions or my_pairs:1.0.0)")
    if not FEATURE.match(a["caption"]):
        raise ConfigError(f"configs/{config_name}:caption={a['caption']!r}: give the name of the dataset's caption "
                          "string feature")
    if a["dataset"] and not a["tokenizer"]:
        raise ConfigError(f"configs/{config_name}:dataset={a['dataset']} needs tokenizer=PATH (the SentencePiece "
                          ".model of the text tower)")


def get_config(arg=None):
    a = parse_config_args(arg, DEFAULTS)
    data_args(a, "siglip.py")
    c = default_config()
    c.objective = "siglip"
    c.model.variant = "B/16"
    c.model.image_size = 224
    c.model.pool, c.model.posemb = "map", "learn"
    c.model.dtype = "bfloat16"
    # 256 images per v3 core, both towers fully rematerialised (the text tower follows model.remat). Measured by the
    # TPU compiler on v3-128: 3.2 GiB of temporaries, 5.65 GiB peak per 16 GiB core; 'dots_no_batch' asked for
    # 48.7 GiB (docs/image_text.md, "Planning").
    c.model.remat = "full"
    s = c.siglip  # the defaults are the B/16 text tower above (train/objectives/image_text.py SigLIPSettings)
    s.embed_dim = 768
    s.text_vocab_size, s.text_max_len = 32_000, 64
    s.text_width, s.text_depth, s.text_heads, s.text_mlp_dim = 768, 12, 12, 3072
    s.text_pool, s.text_causal = "last", False
    s.text_eos_id, s.pad_id = 1, 1  # big_vision's c4_en model: sticky EOS = 1, padded with 1
    s.chunked = True
    s.tokenizer = a["tokenizer"]
    s.zeroshot_classes = ""  # retrieval only (see the docstring)
    _data(c, a, max_len=64)
    c.batch_size = int(a["batch"])
    c.total_examples = int(float(a["examples"]))
    c.optimizer.name = "adamw"
    c.optimizer.lr = 1e-3
    c.optimizer.b1, c.optimizer.b2 = 0.9, 0.95
    c.optimizer.weight_decay = 1e-4
    c.optimizer.grad_clip_norm = 1.0
    c.optimizer.schedule = "cosine"
    c.optimizer.warmup_steps = 5_000
    c.loss.label_smoothing = 0.0
    c.eval.evaluators = ("zeroshot",)
    c.eval.every_steps = 10_000
    c.eval.fewshot.datasets = ()
    c.eval.fewshot.every_epochs = 0.0
    c.log_every_steps = 100
    c.checkpoint.every_steps = 2_000
    c.checkpoint.keep = 3
    return c


def _data(c, a: dict[str, str], max_len: int) -> None:
    """Images at 224 px in [-1, 1] (big_vision's SigLIP preprocessing) and the caption's token ids."""
    c.data.name = a["dataset"]
    c.data.train_split, c.data.eval_split = "train", a["eval_split"]
    c.data.pp_modules = ("vit_jax.data.text_ops",)
    tokens = f"tokenize('{a['tokenizer']}', {max_len}, key='{a['caption']}', pad_id=1)"
    c.data.pp_train = f"decode|resize(224)|value_range(-1,1)|{tokens}"
    c.data.pp_eval = f"decode|resize(224)|value_range(-1,1)|{tokens}"
