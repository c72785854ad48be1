"""Checkpoints: official/big_vision .npz and timm interop, fine-tune surgery, and the Orbax training checkpoints."""
