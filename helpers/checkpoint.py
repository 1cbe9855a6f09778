"""Shipped checkpoints: safetensors files that carry their own config and training record.

    model, tok = load_model("target")     # or "draft"

A checkpoint is `helpers/checkpoints/<name>.safetensors`: the weights (stored as float16 to keep the
repo small, loaded as float32 unless you ask otherwise) plus metadata: the ModelConfig, and the
training record (corpus fingerprint, steps, tokens seen, validation bits/byte). Its sha256 is listed
in `helpers/checkpoints/MANIFEST.json` and checked on every load. Nothing is ever unpickled.

Out of scope: sharded or remote checkpoints.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .model import ModelConfig, Transformer
from .paths import CHECKPOINTS
from .tokenizer import Tokenizer

MANIFEST = CHECKPOINTS / "MANIFEST.json"
TOKENIZER_FILE = CHECKPOINTS / "tokenizer.json"
FORMAT = "llm-inference-executed/1"
TIED = "head.weight"  # the output head shares the embedding matrix; stored once


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, or does not match its manifest entry.

    A RuntimeError by design, not a ValueError: the file on disk is wrong, not an argument the caller
    passed, so `except ValueError` around a call with bad arguments does not swallow a broken install."""


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_manifest() -> dict:
    return json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}


def _regenerate_hint(name: str) -> str:
    entry = read_manifest().get(name, {})
    return entry.get("command", f"python -m helpers.train --preset {name}")


def verified_path(name: str, path: Path | None = None) -> Path:
    """The checkpoint file for `name`, after checking it exists and matches the manifest's sha256."""
    path = Path(path) if path is not None else CHECKPOINTS / f"{name}.safetensors"
    if not path.exists():
        raise CheckpointError(f"checkpoint file {path} is missing. Regenerate it with: {_regenerate_hint(name)}")
    expected = read_manifest().get(name, {}).get("sha256")
    if expected is None:
        raise CheckpointError(f"{MANIFEST} has no sha256 for {name!r}; regenerate with: {_regenerate_hint(name)}")
    actual = sha256_file(path)
    if actual != expected:
        raise CheckpointError(
            f"checkpoint file {path} is corrupt or was changed: its sha256 is {actual[:16]}..., "
            f"the manifest expects {expected[:16]}.... Restore it (git checkout -- {path.name}) "
            f"or regenerate it with: {_regenerate_hint(name)}"
        )
    return path


def save_checkpoint(model: Transformer, path, training: dict, dtype=torch.float16) -> str:
    """Write weights (as `dtype`) with config and training record; returns the file's sha256."""
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items() if k != TIED}
    meta = {"format": FORMAT, "config": json.dumps(model.cfg.to_dict()), "training": json.dumps(training)}
    save_file(tensors, str(path), metadata=meta)
    return sha256_file(path)


def read_metadata(path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a {FORMAT} checkpoint (format={meta.get('format')!r})")
    return {"config": json.loads(meta["config"]), "training": json.loads(meta["training"])}


def model_from_file(path, device=None, dtype=torch.float32) -> Transformer:
    meta = read_metadata(path)
    cfg = ModelConfig(**meta["config"])
    model = Transformer(cfg)
    state = load_file(str(path))
    state[TIED] = state["embed.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"{path}: missing tensors {missing}, unexpected tensors {unexpected}")
    model.training_record = meta["training"]
    return model.to(device=device or "cpu", dtype=dtype).eval()


def load_tokenizer() -> Tokenizer:
    return Tokenizer.load(verified_path("tokenizer", TOKENIZER_FILE))


def load_model(name: str = "target", device=None, dtype=None) -> tuple[Transformer, Tokenizer]:
    """A shipped model ("target" or "draft"), in eval mode, and the tokenizer it was trained with.

    device defaults to `default_device()`; dtype to float32 on a CPU and bfloat16 on a GPU.
    The model's `training_record` attribute holds what its checkpoint says about its training.
    """
    from .device import default_device, default_dtype

    if name not in ("target", "draft"):
        raise ValueError(f"name must be 'target' or 'draft'; got {name!r}")
    device = torch.device(device) if device is not None else default_device()
    dtype = dtype or default_dtype(device)
    model = model_from_file(verified_path(name), device=device, dtype=dtype)
    tok = load_tokenizer()
    if tok.vocab_size != model.cfg.vocab_size:
        raise CheckpointError(f"tokenizer has {tok.vocab_size} ids but {name} expects {model.cfg.vocab_size}")
    return model, tok
