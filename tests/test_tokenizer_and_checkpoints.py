"""Tokenizer round trips, and what happens when a checkpoint is missing or corrupt."""

from __future__ import annotations

import random
import shutil

import pytest
import torch

from helpers import checkpoint
from helpers.checkpoint import CheckpointError, load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_vocabulary_layout(tok):
    assert tok.vocab_size == 2048
    assert (tok.bos_id, tok.eos_id) == (2046, 2047)
    assert all(tok.vocab[i] == bytes([i]) for i in range(256))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1+1=2",
        "中国最高的山是什么？",
        "猫 追 老鼠 <|eos|>",
        "def f(x):\n    return x\n",
        "emoji 🙂 and é, ß, \t\r\n",
        "<|bos|>",
    ],
)
def test_round_trip_examples(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.bos_id not in ids and tok.eos_id not in ids  # special strings in text stay text


def test_round_trip_random_utf8(tok):
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(0, 60)
        # code points from every plane, surrogates excluded (they are not valid in UTF-8)
        text = "".join(
            chr(
                rng.choice(
                    [
                        rng.randint(0x20, 0x7E),
                        rng.randint(0xA0, 0xD7FF),
                        rng.randint(0xE000, 0xFFFD),
                        rng.randint(0x10000, 0x10FFFF),
                    ]
                )
            )
            for _ in range(n)
        )
        assert tok.decode(tok.encode(text)) == text


def test_round_trip_random_bytes(tok):
    rng = random.Random(1)
    for _ in range(300):
        data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 80)))  # mostly invalid UTF-8
        assert tok.decode_bytes(tok.encode_bytes(data)) == data


def test_special_tokens(tok):
    ids = tok.encode("abc", bos=True, eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.decode(ids) == "abc"
    assert tok.decode(ids, skip_special=False) == "<|bos|>abc<|eos|>"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([5000])


def test_bpe_compresses_code(tok):
    text = "    def __init__(self, name):\n        self.name = name\n"
    assert len(tok.encode(text)) < len(text.encode()) / 2.5


def test_train_bpe_is_deterministic():
    from helpers.data import validation_text
    from helpers.tokenizer import train_bpe

    text = validation_text()[:20_000]
    a, b = train_bpe(text, 300), train_bpe(text, 300)
    assert a.merges == b.merges and len(a.merges) == 300 - 256 - 2
    assert a.decode(a.encode(text)) == text


def test_shipped_models_load(shipped):
    target, draft, tok = shipped
    for m in (target, draft):
        assert m.cfg.vocab_size == tok.vocab_size
        rec = m.training_record
        assert rec["corpus"]["sha256"] and rec["steps"] > 0 and rec["tokens_seen"] > 0
        assert 0 < rec["val_bits_per_byte"] < 3
    assert draft.num_parameters() * 5 <= target.num_parameters()
    assert draft.cfg.n_layers < target.cfg.n_layers


def test_missing_checkpoint_names_file_and_command(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "CHECKPOINTS", tmp_path)
    msg = r"target\.safetensors is missing\. Regenerate it with: python -m helpers\.train"
    with pytest.raises(CheckpointError, match=msg):
        checkpoint.load_model("target", device="cpu")


def test_corrupt_checkpoint_is_refused(tmp_path, monkeypatch):
    src = checkpoint.CHECKPOINTS / "draft.safetensors"
    bad = tmp_path / "draft.safetensors"
    shutil.copy(src, bad)
    data = bytearray(bad.read_bytes())
    data[-10] ^= 0xFF  # flip bits in one weight
    bad.write_bytes(bytes(data))
    monkeypatch.setattr(checkpoint, "CHECKPOINTS", tmp_path)
    with pytest.raises(CheckpointError, match=r"draft\.safetensors is corrupt or was changed: its sha256 is"):
        checkpoint.load_model("draft", device="cpu")


def test_unknown_model_name():
    with pytest.raises(ValueError, match="name must be 'target' or 'draft'"):
        checkpoint.load_model("gpt5")


def test_checkpoint_round_trip(tmp_path):
    from conftest import random_model

    from helpers.model import ModelConfig

    m = random_model(ModelConfig.from_preset("tiny"))
    checkpoint.save_checkpoint(m, tmp_path / "m.safetensors", {"steps": 1}, dtype=torch.float32)
    m2 = checkpoint.model_from_file(tmp_path / "m.safetensors")
    x = torch.randint(0, 256, (1, 20))
    assert torch.equal(m(x), m2(x)) and m2.training_record == {"steps": 1}
    assert m2.head.weight is m2.embed.weight  # tied again after loading
