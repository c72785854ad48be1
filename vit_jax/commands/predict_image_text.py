"""`vit-jax predict` of a two-tower (image-text) checkpoint: a siglip/clip run, LiT's included, or a big_vision SigLIP
.npz (train/objectives/image_text.py `load_image_text`).

OUTPUT gets the images' L2-normalised embeddings (N, E). With `--texts FILE` (one text per line), the texts are
tokenized by the run's SentencePiece model (or `--tokenizer PATH`, needed for a .npz) and OUTPUT_texts.npy gets their
embeddings (T, E) and OUTPUT_logits.npy the zero-shot logits exp(t) * img . txt + b (N, T): SigLIP's, whose sigmoid is
the probability that a text matches an image; a CLIP run's b stays 0 (its loss does not use it), and a softmax over
the texts ranks them. Each image's best text is printed.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import numpy as np

BIG_VISION_PAD = 1  # big_vision's SigLIP tokenizers pad with 1 (= their end-of-text id)


def recorded_tokenizer(path: str) -> tuple[str, int] | None:
    """(tokenizer, pad id) a siglip/clip run recorded; None for a file."""
    if not os.path.isdir(path):
        return None
    from vit_jax.checkpoints.training import load_run_metadata

    config = load_run_metadata(path).get("config", {})
    settings = config.get(config.get("objective", ""), {})
    return settings.get("tokenizer", ""), int(settings.get("pad_id", 0))


def embed_batches(fn, items: np.ndarray, batch_size: int) -> np.ndarray:
    """fn over `items` in batches, the last one padded to the batch size (one compiled shape)."""
    out = []
    for start in range(0, len(items), batch_size):
        chunk = items[start:start + batch_size]
        pad = batch_size - len(chunk)
        padded = np.concatenate([chunk, np.repeat(chunk[-1:], pad, axis=0)]) if pad else chunk
        out.append(np.asarray(fn(padded))[:len(chunk)])
    return np.concatenate(out)


def predict_image_text(args: argparse.Namespace, spec: Any, params: dict[str, Any], images: np.ndarray | None) -> int:
    """Writes the embeddings (and with --texts the text embeddings and logits) of `args`' images; 2 on a usage
    error (one line on stderr)."""
    import jax
    import jax.numpy as jnp

    from vit_jax.data.image_files import default_eval_pp, read_image_folder

    print(f"checkpoint {args.checkpoint}: two towers, {spec.name}")
    names = None
    if images is None:
        folder = read_image_folder(args.images, default_eval_pp(spec.image.image_size), strict=args.strict)
        images, names = folder.images, folder.names
        for name, why in folder.skipped.items():
            print(f"skipped {name}: {why}", file=sys.stderr)
    if tuple(images.shape[1:3]) != tuple(spec.image.image_size):
        print(f"error: images are {images.shape[1]}x{images.shape[2]} but the image tower expects "
              f"{spec.image.image_size[0]}x{spec.image.image_size[1]}", file=sys.stderr)
        return 2
    texts = None
    if args.texts:
        with open(args.texts) as f:
            texts = [line.strip() for line in f if line.strip()]
        if not texts:
            print(f"error: --texts {args.texts} holds no text (one per line)", file=sys.stderr)
            return 2
        recorded = recorded_tokenizer(args.checkpoint)
        tokenizer = args.tokenizer or (recorded[0] if recorded else "")
        if not tokenizer:
            print("error: --texts needs --tokenizer PATH (the text tower's SentencePiece .model)", file=sys.stderr)
            return 2
    params = jax.tree.map(jnp.asarray, params)
    model = spec.model()
    zimg = embed_batches(jax.jit(lambda x: model.bind(params).embed_image(x)), images.astype(np.float32),
                         args.batch_size)
    np.save(args.output, zimg)
    print(f"wrote {args.output}: image embeddings {zimg.shape}")
    if texts is None:
        return 0
    from vit_jax.data.text_ops import load_tokenizer

    pad = recorded[1] if recorded else BIG_VISION_PAD
    ids = load_tokenizer(tokenizer, pad)(texts, spec.text.max_len)
    if ids.max() >= spec.text.vocab_size:
        print(f"error: tokenizer {tokenizer} gives ids up to {ids.max()}, beyond the text tower's vocabulary of "
              f"{spec.text.vocab_size}", file=sys.stderr)
        return 2
    ztxt = embed_batches(jax.jit(lambda x: model.bind(params).embed_text(x)), ids, args.batch_size)
    t, b = (float(v) for v in jax.jit(lambda: model.bind(params).scalars())())
    logits = t * zimg @ ztxt.T + b
    base = args.output[:-len(".npy")] if args.output.endswith(".npy") else args.output
    np.save(f"{base}_texts.npy", ztxt)
    np.save(f"{base}_logits.npy", logits)
    print(f"wrote {base}_texts.npy: text embeddings {ztxt.shape}; {base}_logits.npy: zero-shot logits {logits.shape}")
    for i, row in enumerate(logits):
        best = int(np.argmax(row))
        print(f"{names[i] if names else i}: {texts[best]!r} (logit {row[best]:.3f})")
    return 0
