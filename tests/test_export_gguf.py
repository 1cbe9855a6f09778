"""GGUF export: every tensor read back from the file, the RoPE row permutation, the vocabulary, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import export_gguf
from helpers.export_gguf import bytes_to_unicode, gguf_tensors, read_gguf_tensors, vocabulary, write_gguf
from helpers.model import apply_rope, rope_tables

gguf = pytest.importorskip("gguf", reason="the GGUF export needs the gguf package (requirements-ci.txt)")


def rotate_adjacent_pairs(x, cos, sin):
    """llama.cpp's rotation ("normal" RoPE): pairs (x_2i, x_2i+1) by angle i. x: (..., D); cos, sin: (D/2,)."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)


def test_permutation_turns_rotate_half_into_adjacent_pairs(shipped):
    target, _, _ = shipped
    cfg = target.cfg
    H, D = cfg.n_heads, cfg.head_dim
    cos, sin = rope_tables(cfg)  # (S, D), rotate-half layout: angle i sits at columns i and i + D/2
    perm = export_gguf.rope_half_to_adjacent(H, D)
    assert sorted(perm.tolist()) == list(range(H * D))  # a permutation of the rows
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, H, D, generator=g, dtype=torch.float64).unbind(0)  # one token's q and k, (H, D) each
    for pos in (0, 1, 77, cfg.max_seq_len - 1):
        c, s = cos[pos].double(), sin[pos].double()
        ours_q, ours_k = apply_rope(q, c, s), apply_rope(k, c, s)  # (H, D)
        theirs_q = rotate_adjacent_pairs(q.reshape(-1)[perm].view(H, D), c[: D // 2], s[: D // 2])
        theirs_k = rotate_adjacent_pairs(k.reshape(-1)[perm].view(H, D), c[: D // 2], s[: D // 2])
        # llama.cpp's rotation of the permuted vector is the permuted rotation of ours ...
        assert torch.allclose(theirs_q.reshape(-1), ours_q.reshape(-1)[perm], atol=1e-12, rtol=0)
        # ... so every attention score q.k is the same
        assert torch.allclose((theirs_q * theirs_k).sum(-1), (ours_q * ours_k).sum(-1), atol=1e-12, rtol=0)


def expected_tensors(model) -> dict[str, np.ndarray]:
    """The model's own weights by GGUF name, in our layout (no permutation), float32."""
    cfg = model.cfg
    q_dim, kv_dim = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    out = {"token_embd.weight": model.embed.weight, "output_norm.weight": model.norm.weight}
    for i, layer in enumerate(model.layers):
        wq, wk, wv = layer.attn.wqkv.weight.split([q_dim, kv_dim, kv_dim])
        gate, up = layer.mlp.w_gate_up.weight.split(cfg.d_ff)
        out |= {
            f"blk.{i}.attn_norm.weight": layer.attn_norm.weight,
            f"blk.{i}.attn_q.weight": wq,
            f"blk.{i}.attn_k.weight": wk,
            f"blk.{i}.attn_v.weight": wv,
            f"blk.{i}.attn_output.weight": layer.attn.wo.weight,
            f"blk.{i}.ffn_norm.weight": layer.mlp_norm.weight,
            f"blk.{i}.ffn_gate.weight": gate,
            f"blk.{i}.ffn_up.weight": up,
            f"blk.{i}.ffn_down.weight": layer.mlp.w_down.weight,
        }
    return {k: v.detach().float().numpy() for k, v in out.items()}


def unpermute(name: str, a: np.ndarray, cfg) -> np.ndarray:
    if name.endswith("attn_q.weight"):
        perm = export_gguf.rope_half_to_adjacent(cfg.n_heads, cfg.head_dim)
    elif name.endswith("attn_k.weight"):
        perm = export_gguf.rope_half_to_adjacent(cfg.n_kv_heads, cfg.head_dim)
    else:
        return a
    out = np.empty_like(a)
    out[perm.numpy()] = a  # row perm[j] of ours became row j of the file
    return out


@pytest.mark.parametrize("file_type", ["f32", "f16"])
def test_file_reads_back_every_tensor_exactly(shipped, tmp_path, file_type):
    target, _, tok = shipped
    cfg = target.cfg
    path = write_gguf(target, tok, tmp_path / f"target-{file_type}.gguf", file_type, name="target")
    reader = gguf.GGUFReader(str(path))
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    assert field("general.architecture") == "llama"
    assert (
        field("llama.block_count"),
        field("llama.embedding_length"),
        field("llama.feed_forward_length"),
        field("llama.attention.head_count"),
        field("llama.attention.head_count_kv"),
        field("llama.rope.dimension_count"),
        field("llama.context_length"),
        field("llama.vocab_size"),
    ) == (
        cfg.n_layers,
        cfg.d_model,
        cfg.d_ff,
        cfg.n_heads,
        cfg.n_kv_heads,
        cfg.head_dim,
        cfg.max_seq_len,
        cfg.vocab_size,
    )
    assert field("llama.rope.freq_base") == cfg.rope_theta
    assert abs(field("llama.attention.layer_norm_rms_epsilon") - cfg.norm_eps) < 1e-12
    assert (field("tokenizer.ggml.bos_token_id"), field("tokenizer.ggml.eos_token_id")) == (tok.bos_id, tok.eos_id)

    want = expected_tensors(target)
    types = {t.name: t.tensor_type for t in reader.tensors}
    got = read_gguf_tensors(path)
    assert set(got) == set(want) and len(got) == 2 + 9 * cfg.n_layers  # the tied head is not written
    matrix_type = gguf.GGMLQuantizationType.F32 if file_type == "f32" else gguf.GGMLQuantizationType.F16
    for name, expected in want.items():
        assert types[name] == (gguf.GGMLQuantizationType.F32 if expected.ndim == 1 else matrix_type), name
        assert got[name].shape == expected.shape, name
        # exact even in f16: the shipped checkpoints store float16 weights
        assert np.array_equal(unpermute(name, got[name], cfg), expected), name


def test_quantized_file_is_within_block_rounding(shipped, tmp_path):
    target, _, tok = shipped
    cfg = target.cfg
    got = read_gguf_tensors(write_gguf(target, tok, tmp_path / "target-q8_0.gguf", "q8_0"))
    for name, expected in expected_tensors(target).items():
        back = unpermute(name, got[name], cfg)
        if expected.ndim == 1:
            assert np.array_equal(back, expected), name
            continue
        blocks = expected.reshape(-1, 32)  # q8_0: 32 weights share one float16 scale max|w| / 127
        step = np.abs(blocks).max(axis=1, keepdims=True) / 127
        err = np.abs(back.reshape(-1, 32) - blocks)
        # half a step of rounding, plus up to 127 codes times the scale's own float16 rounding (2^-11 relative)
        assert (err <= 1.01 * (0.5 + 127 * 2**-11) * step + 1e-7).all(), name


def test_vocabulary_decodes_to_our_bytes(shipped):
    _, _, tok = shipped
    tokens, types, merges = vocabulary(tok)
    char_byte = {c: b for b, c in bytes_to_unicode().items()}
    assert len(set(bytes_to_unicode().values())) == 256
    assert len(tokens) == tok.vocab_size and len(merges) == tok.vocab_size - 256 - len(tok.special_tokens)
    specials = set(tok.special_tokens.values())
    for i, s in enumerate(tokens):
        if i in specials:
            assert s in tok.special_tokens and types[i] == int(gguf.TokenType.CONTROL)
        else:
            assert bytes(char_byte[c] for c in s) == tok.vocab[i] and types[i] == int(gguf.TokenType.NORMAL)
    left, right = merges[0].split(" ")
    (a, b), first = min(tok.merges.items(), key=lambda kv: kv[1])
    assert tokens[a] == left and tokens[b] == right and tokens[first] == left + right


def test_bad_file_type_is_refused(shipped, tmp_path):
    target, _, tok = shipped
    with pytest.raises(ValueError, match="file_type must be one of"):
        write_gguf(target, tok, tmp_path / "x.gguf", "q5_k")


def test_tensor_names_cover_the_model(shipped):
    target, _, _ = shipped
    tensors = gguf_tensors(target)
    n_weights = sum(a.size for a in tensors.values())
    assert n_weights == target.num_parameters()  # every parameter once (tied head = token_embd)
