"""helpers.measure.flops against the real thing: counted parameters, torch's FlopCounterMode, the tensors
autograd saves, the allocated KV cache. All counts are integers and must agree exactly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop
from torch.utils.flop_counter import FlopCounterMode

from helpers import KVCache, ModelConfig, Transformer
from helpers.measure.flops import (
    activation_bytes,
    arithmetic_intensity,
    attention_flops,
    forward_bytes,
    forward_flops,
    gpt_forward_flops,
    inference_memory_bytes,
    kv_cache_bytes,
    layer_activation_bytes,
    matmul_parameters,
    parameter_count,
    training_flops,
    training_memory_bytes,
    weight_bytes,
)

TINY = ModelConfig.from_preset("tiny")
LLAMA = ModelConfig.from_preset("llama3-8b")


def counted_flops(fn) -> int:
    """FLOPs torch counts, with attention forced onto the math backend (plain batched matmuls, which
    the counter sees on every device; the fused CPU kernel has no FLOP formula registered)."""
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("preset", ["tiny", "draft", "target", "bench-150m"])
def test_parameter_count_matches_the_module(preset):
    cfg = ModelConfig.from_preset(preset)
    with torch.device("meta"):
        model = Transformer(cfg)
    assert parameter_count(cfg) == model.num_parameters()
    assert parameter_count(cfg, tied_embeddings=False) == model.num_parameters() + cfg.vocab_size * cfg.d_model


def test_llama3_8b_parameter_count():
    # Llama-3-8B does not tie its embedding and output head: 8,030,261,248 parameters
    assert parameter_count(LLAMA, tied_embeddings=False) == 8_030_261_248
    with torch.device("meta"):
        model = Transformer(LLAMA)  # the course Transformer ties them
    assert model.num_parameters() == parameter_count(LLAMA)


def test_forward_flops_match_flop_counter_prefill_and_decode():
    torch.manual_seed(0)
    model = Transformer(TINY).eval()
    T = 40
    x = torch.randint(0, TINY.vocab_size, (2, T))
    with torch.no_grad():
        assert counted_flops(lambda: model(x)) == forward_flops(TINY, T, batch_size=2, count_masked=True)
        cache = KVCache.for_model(model, 2, 64)
        assert counted_flops(lambda: model(x, cache=cache, last_only=True)) == forward_flops(
            TINY, T, batch_size=2, count_masked=True, all_logits=False
        )
        token = torch.zeros(2, 1, dtype=torch.long)
        # a single query sees every cached key: no masked pairs, both conventions agree
        assert counted_flops(lambda: model(token, cache=cache)) == forward_flops(TINY, 1, n_past=T, batch_size=2)


def test_forward_flops_match_flop_counter_on_meta_llama():
    with torch.device("meta"):
        model = Transformer(LLAMA)
    x = torch.zeros(1, 64, dtype=torch.long, device="meta")
    with torch.no_grad():
        assert counted_flops(lambda: model(x, check=False)) == forward_flops(LLAMA, 64, count_masked=True)


def test_training_step_is_three_forwards():
    torch.manual_seed(0)
    model = Transformer(TINY)
    x = torch.randint(0, TINY.vocab_size, (2, 33))

    def step():
        logits = model(x[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()).backward()

    assert counted_flops(step) == training_flops(TINY, 32, batch_size=2)

    def checkpointed_step():
        cos, sin = model.rope_cos[:32], model.rope_sin[:32]
        h = model.embed(x[:, :-1])
        for layer in model.layers:
            h = checkpoint(layer, h, cos, sin, use_reentrant=False)
        F.cross_entropy(model.head(model.norm(h)).flatten(0, 1), x[:, 1:].flatten()).backward()

    # every layer's forward runs twice, the head's once (with early stopping off, torch recomputes
    # whole layers; with it on, it skips each layer's last matmul, whose output the backward never needs)
    with set_checkpoint_early_stop(False):
        assert counted_flops(checkpointed_step) == training_flops(TINY, 32, batch_size=2, checkpointing=True)
    assert counted_flops(checkpointed_step) < training_flops(TINY, 32, batch_size=2, checkpointing=True)
    fwd = forward_flops(TINY, 32, batch_size=2, count_masked=True)
    assert 3 * fwd < training_flops(TINY, 32, 2, checkpointing=True) < 4 * fwd


def test_causal_attention_counts_half_the_square_plus_diagonal():
    T = 10
    full = attention_flops(TINY, T, count_masked=True)
    causal = attention_flops(TINY, T)
    assert causal * 2 * T == full * (T + 1)
    assert attention_flops(TINY, 1, n_past=9) == attention_flops(TINY, 1, n_past=9, count_masked=True)
    # the old behaviour (sum over positions) is kept
    assert causal == TINY.n_layers * 4 * TINY.n_heads * TINY.head_dim * sum(t + 1 for t in range(T))


def test_gpt_formula_is_the_special_case_mha_and_swiglu_of_width_8d_over_3():
    # SwiGLU of width 8d/3 costs what a two-matrix MLP of width 4d costs: 6 * d * (8d/3) = 16 d^2
    cfg = ModelConfig(vocab_size=300, n_layers=3, d_model=96, n_heads=4, n_kv_heads=4, d_ff=256)
    for n in (1, 7, 50):
        assert gpt_forward_flops(cfg, n) == forward_flops(cfg, n, count_masked=True)
    assert gpt_forward_flops(LLAMA, 5) != forward_flops(LLAMA, 5, count_masked=True)


def saved_activation_bytes(model, x, checkpoint_layers=False) -> int:
    """Bytes of the distinct floating-point storages autograd saves, parameters and buffers excluded."""
    skip = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip and t.is_floating_point():
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    T = x.shape[1] - 1
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if checkpoint_layers:
            cos, sin = model.rope_cos[:T], model.rope_sin[:T]
            h = model.embed(x[:, :-1])
            for layer in model.layers:
                h = checkpoint(layer, h, cos, sin, use_reentrant=False)
            logits = model.head(model.norm(h))
        else:
            logits = model(x[:, :-1])
        F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten())
    return sum(seen.values())


@pytest.mark.parametrize("preset", ["tiny", "draft"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_bytes_equal_what_autograd_saves(preset, dtype):
    cfg = ModelConfig.from_preset(preset)
    torch.manual_seed(0)
    model = Transformer(cfg).to(dtype)
    e = torch.empty((), dtype=dtype).element_size()
    for B, T in ((2, 24), (1, 40)):
        x = torch.randint(0, cfg.vocab_size, (B, T + 1))
        # + 4: the scalar loss
        assert saved_activation_bytes(model, x) == activation_bytes(cfg, B, T, e) + 4
        # checkpointing keeps the layer inputs and the head; the peak adds one recomputed layer
        kept = activation_bytes(cfg, B, T, e, checkpointing=True) - layer_activation_bytes(cfg, B, T, e)
        assert saved_activation_bytes(model, x, checkpoint_layers=True) == kept + 4


def test_training_memory_of_llama3_8b():
    parts = training_memory_bytes(LLAMA, 1, 4096, tied_embeddings=False)
    P = 8_030_261_248
    assert parts["weights"] == 4 * P and parts["gradients"] == 4 * P and parts["optimizer"] == 8 * P
    assert parts["total"] == sum(v for k, v in parts.items() if k != "total")
    ckpt = training_memory_bytes(LLAMA, 1, 4096, tied_embeddings=False, checkpointing=True)
    assert ckpt["activations"] < parts["activations"] / 5
    assert 2e9 < ckpt["activations"] < 6e9 and 20e9 < parts["activations"] < 40e9


def test_inference_memory_and_kv_cache():
    torch.manual_seed(0)
    model = Transformer(TINY)
    cache = KVCache.for_model(model, batch_size=3, max_seq_len=50, dtype=torch.bfloat16)
    assert kv_cache_bytes(TINY, 50, 3, torch.bfloat16) == cache.k.nbytes + cache.v.nbytes
    parts = inference_memory_bytes(LLAMA, 4096, tied_embeddings=False)
    assert parts["weights"] == 2 * 8_030_261_248
    assert parts["kv_cache"] == 32 * 2 * 8 * 128 * 4096 * 2  # 0.537 GB
    assert parts["total"] == parts["weights"] + parts["kv_cache"] + parts["activations"]
    assert inference_memory_bytes(LLAMA, 4096, bits_per_weight=4)["weights"] == weight_bytes(LLAMA, 4)


def test_decode_intensity_is_about_two_flops_per_weight_byte():
    # batch 1 decode: 2 FLOPs per weight, each weight read once -> intensity ~ 2 / bytes_per_weight
    for bpw in (4, 2, 1, 0.5):
        ai = arithmetic_intensity(LLAMA, 1, n_past=100, bytes_per_weight=bpw)
        assert 0.95 * 2 / bpw < ai < 1.01 * 2 / bpw
    # batching multiplies the FLOPs but not the weight bytes
    assert arithmetic_intensity(LLAMA, 1, 100, batch_size=16) > 10 * arithmetic_intensity(LLAMA, 1, 100)
    assert forward_bytes(LLAMA, 1, 0, bytes_per_weight=2) > 2 * matmul_parameters(LLAMA)
    assert arithmetic_intensity(LLAMA, 2048) > 500 * arithmetic_intensity(LLAMA, 1, 2047)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: forward_flops(TINY, 0), "n_tokens"),
        (lambda: attention_flops(TINY, 3, n_past=-1), "n_past"),
        (lambda: forward_flops(TINY, 3, batch_size=0), "batch_size"),
        (lambda: activation_bytes(TINY, 1, 0), "seq_len"),
        (lambda: activation_bytes(TINY, 1, 8, bytes_per_element=3), "bytes_per_element"),
        (lambda: training_memory_bytes(TINY, 0, 8), "batch_size"),
        (lambda: weight_bytes(TINY, 0), "bits_per_weight"),
        (lambda: inference_memory_bytes(TINY, 0), "seq_len"),
    ],
)
def test_bad_arguments_raise_value_errors_naming_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()
