"""Quantization: the by-hand arithmetic (error bounds), the real kernels against the dequantize-then-
matmul reference, whole quantized models, and bad input.

Tolerances, and why:
- Round trip: every weight is within half a step (scale / 2) of its original, plus the rounding of a
  bf16-stored scale or zero (2^-8 relative) where scales are stored in bf16.
- CPU kernels vs reference: int8pack/int4pack read bf16 activations and return bf16, so the reference
  is computed the same way (bf16 input, fp32 math); measured difference <= 1 bf16 rounding of the
  output, asserted as 2^-7 * |y| + 1e-4 * max|y|. A wrong packing or scale layout gives O(1) errors.
- "dynamic" (fbgemm) also rounds activations to uint8; its reference does that too (<= 1e-4 * max|y|).
  For int4 (the C++ kernel, tests/test_cpu_kernels.py) the reference rounds them to int8 per group as
  it does; the integer sums are exact, so only float summation order differs (<= 1e-5 * max|y|).
- Whole model, CPU kernels vs reference model: max |logit difference| <= 0.1 (measured <= 0.04 on the
  shipped model, whose logits have a standard deviation of about 2; int4 rounding itself moves them
  by 0.4-1.1).
- CUDA (run only where a GPU is present): tinygemm dequantizes to bf16 and accumulates bf16 tiles, so
  relative error in norm <= 2e-2.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn as nn
from conftest import random_model
from torch._inductor.utils import run_and_get_code

from helpers.compiling import conversions_kept
from helpers.fast_decode import FastGenerator, compile_available
from helpers.generate import decode_one_token, generate, prefill
from helpers.kv_cache import KVCache
from helpers.model import ModelConfig
from helpers.quantize import (
    ROW_SPLIT,
    QuantizedLinear,
    available_kernels,
    dequantize_absmax,
    dequantize_groupwise,
    dynamic_int8_saturates,
    dynamic_weight_bits,
    int4_dynamic,
    native,
    pack_int4,
    pack_int4_halves,
    quantize_absmax,
    quantize_groupwise,
    quantize_model,
    unpack_int4,
    unpack_int4_halves,
    weight_bytes_breakdown,
)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Many small ops: one thread is faster and far steadier than two on a busy machine."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


BF16_REL = 2.0**-8  # relative rounding error of a bf16-stored number
TINY = ModelConfig.from_preset("tiny")  # d_model 64, d_ff 128: every in_features is a multiple of 32


def weights(N=96, K=256, seed=0, spread=True):
    """Random weights whose rows differ in magnitude by up to 30x, as real layers' rows do."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * 0.02
    if spread:
        w *= torch.logspace(-0.75, 0.75, N).unsqueeze(1)
    return w


# --- by hand ---------------------------------------------------------------------------------


def test_lecture_notes_absmax_example():
    w = torch.tensor([[0.234, -0.891, 1.234, -0.567]])
    q, scale = quantize_absmax(w)
    assert q.tolist() == [[24, -92, 127, -58]]  # the notes print 23 for the first: round(24.08) is 24
    assert scale.item() == pytest.approx(1.234 / 127)
    expected = torch.tensor([[0.2332, -0.8939, 1.2340, -0.5636]])
    assert torch.allclose(dequantize_absmax(q, scale), expected, atol=1e-4)


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16])
def test_absmax_round_trip_within_half_a_step(per_channel, scale_dtype):
    w = weights()
    q, scale = quantize_absmax(w, per_channel=per_channel, scale_dtype=scale_dtype)
    assert q.dtype == torch.int8 and q.abs().max() <= 127
    assert scale.shape == ((w.shape[0], 1) if per_channel else ())
    err = (dequantize_absmax(q, scale) - w).abs()
    assert (err <= scale.float() / 2 * (1 + 1e-5) + 1e-9).all()


def test_per_channel_beats_per_tensor_when_rows_differ():
    w = weights(spread=True)
    err_tensor = (dequantize_absmax(*quantize_absmax(w)) - w).pow(2).mean()
    err_channel = (dequantize_absmax(*quantize_absmax(w, per_channel=True)) - w).pow(2).mean()
    assert err_channel < err_tensor / 3


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("group_size", [32, 64])
def test_groupwise_round_trip_within_half_a_step(bits, symmetric, group_size):
    w = weights()
    q, scales, zeros = quantize_groupwise(w, bits=bits, group_size=group_size, symmetric=symmetric)
    G = w.shape[1] // group_size
    assert scales.shape == (w.shape[0], G)
    if symmetric:
        assert zeros is None and q.dtype == torch.int8 and q.abs().max() <= 2 ** (bits - 1) - 1
    else:
        assert zeros.shape == scales.shape and q.dtype == torch.uint8 and q.max() <= 2**bits - 1
    w_hat = dequantize_groupwise(q, scales, zeros, group_size, bits=bits)
    step = scales.repeat_interleave(group_size, dim=1)  # (N, K): each weight's own step
    assert ((w_hat - w).abs() <= step / 2 * (1 + 1e-4) + 1e-9).all()


def test_groupwise_with_bf16_scales_and_zeros():
    w = weights()
    q, scales, zeros = quantize_groupwise(w, bits=4, group_size=64, scale_dtype=torch.bfloat16)
    w_hat = dequantize_groupwise(q, scales, zeros, 64)
    step = scales.float().repeat_interleave(64, dim=1)
    zero = zeros.float().abs().repeat_interleave(64, dim=1)
    # the grid moved by the zero's and the scale's rounding; the end codes may clip by that much
    bound = step / 2 + zero * BF16_REL + 8 * step * BF16_REL
    assert ((w_hat - w).abs() <= bound * (1 + 1e-4)).all()


def test_smaller_groups_and_more_bits_give_smaller_error():
    w = weights()

    def rms(bits, g):
        q, s, z = quantize_groupwise(w, bits=bits, group_size=g)
        return (dequantize_groupwise(q, s, z, g, bits=bits) - w).pow(2).mean().sqrt()

    assert rms(4, 32) < rms(4, 128) < rms(4, 256)
    assert rms(8, 64) < rms(4, 64) / 8 < rms(3, 64)


def test_constant_and_zero_groups_round_trip_exactly():
    w = torch.zeros(8, 64)
    w[1] = 0.5
    for symmetric in (False, True):
        q, s, z = quantize_groupwise(w, group_size=32, symmetric=symmetric)
        assert torch.equal(dequantize_groupwise(q, s, z, 32), w)
    q, s = quantize_absmax(torch.zeros(3, 5), per_channel=True)
    assert torch.equal(dequantize_absmax(q, s), torch.zeros(3, 5))


def test_pack_unpack_int4():
    q = torch.randint(0, 16, (6, 10), dtype=torch.uint8)
    packed = pack_int4(q)
    assert packed.shape == (6, 5) and packed.dtype == torch.uint8
    assert torch.equal(unpack_int4(packed), q)
    assert packed[0, 0] == q[0, 0] | (q[0, 1] << 4)  # even k in the low nibble


def test_pack_unpack_int4_halves():
    q = torch.randint(0, 16, (5, 96), dtype=torch.uint8)
    packed = pack_int4_halves(q, 32)
    assert packed.shape == (5, 3, 16) and packed.dtype == torch.uint8
    assert torch.equal(unpack_int4_halves(packed), q)
    assert packed[0, 1, 2] == q[0, 32 + 2] | (q[0, 32 + 16 + 2] << 4)  # a group's halves share a byte


# --- real kernels vs the reference -----------------------------------------------------------

SHAPES = [(768, 256), (256, 704), (64, 128)]  # the course model's wqkv, w_down, and a tiny layer


def bf16_reference(x, w):
    """What a bf16-activation kernel should compute: bf16 input, fp32 math."""
    return x.to(torch.bfloat16).float() @ w.T


def emulate_dynamic_activation_quant(x):
    """fbgemm's dynamic quantization of activations: one asymmetric uint8 scale for the whole input."""
    lo, hi = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
    scale = (hi - lo) / 255
    zero_point = min(255, max(0, round(-lo / scale)))
    return ((torch.round(x / scale) + zero_point).clamp(0, 255) - zero_point) * scale


@pytest.mark.parametrize("N,K", SHAPES)
@pytest.mark.parametrize("method,group_size", [("int8", None), ("int4", 32), ("int4", 64)])
def test_cpu_kernels_match_reference(N, K, method, group_size):
    torch.manual_seed(0)
    linear = nn.Linear(K, N, bias=False)
    x = torch.randn(3, 5, K)  # (B, T, K): leading dimensions are kept
    reference = QuantizedLinear.from_linear(linear, method, group_size or 64, kernel="reference")
    w_ref = reference.dequantized_weight()  # (N, K)
    kernels = [k for k in available_kernels(method, "cpu") if k != "reference"]
    assert kernels, "no real kernel available on this CPU"
    for kernel in kernels:
        if (method, kernel, group_size) == ("int4", "dynamic", 32):  # its loop reads 64 codes at a time
            with pytest.raises(ValueError, match="group_size must be 64 or a multiple of 128"):
                QuantizedLinear.from_linear(linear, method, group_size, kernel=kernel)
            continue
        layer = QuantizedLinear.from_linear(linear, method, group_size or 64, kernel=kernel)
        y = layer(x)
        assert y.shape == (3, 5, N) and y.dtype == x.dtype
        x2 = x.reshape(-1, K)
        if kernel in ("int8pack", "int4pack"):
            expected = bf16_reference(x2, w_ref)
            bound = 2.0**-7 * expected.abs() + 1e-4 * expected.abs().max()
        elif kernel == "dynamic" and method == "int4":  # 15 rows: activations rounded per group (int4_dynamic)
            expected = int4_dynamic.reference_mm(x2, layer.qweight, layer.scales, layer.zeros, group_size)
            bound = 1e-5 * expected.abs().max()
        elif kernel == "dynamic":  # the ideal of its formats: 8-bit activations, the layer's own weight codes
            assert layer.weight_bits == dynamic_weight_bits()
            expected = emulate_dynamic_activation_quant(x2) @ layer.dequantized_weight().T
            bound = 1e-4 * expected.abs().max()
        else:  # linear_then_scale, cpu_rows: plain fp32 math in another order
            expected = x2 @ w_ref.T
            bound = 1e-5 * expected.abs().max()
        err = (y.reshape(-1, N) - expected).abs()
        assert (err <= bound).all(), f"{kernel}: max error {err.max().item():.3g}"


@pytest.mark.parametrize(
    "method,N,K,group_size",
    [
        ("int8", 37, 100, None),
        ("int8", 1, 7, None),
        ("int8", 44, 100, None),
        ("int4", 37, 96, 32),
        ("int4", 5, 256, 128),
        ("int4", 12, 96, 32),
    ],
)
def test_fused_dequant_single_row_matches_reference(method, N, K, group_size):
    """The batch-1 path (the one a compiled step fuses) on odd shapes, eager: every leading shape of one row.
    N = 44 and 12 are cut into ROW_SPLIT blocks of rows; 37, 1 and 5 are not (not divisible)."""
    assert (N % ROW_SPLIT == 0) == (N in (44, 12))
    w = weights(N, K, seed=3)
    reference = QuantizedLinear(w, method, group_size or 64, kernel="reference")
    layer = QuantizedLinear(w, method, group_size or 64, kernel="fused_dequant")
    assert torch.equal(layer.dequantized_weight(), reference.dequantized_weight())  # the same codes
    x = torch.randn(K, generator=torch.Generator().manual_seed(4))
    expected = reference(x.reshape(1, K))  # (1, N)
    for shape in [(K,), (1, K), (1, 1, K)]:
        y = layer(x.reshape(shape))
        assert y.shape == shape[:-1] + (N,) and y.dtype == x.dtype
        assert (y.reshape(1, N) - expected).abs().max() <= 1e-5 * expected.abs().max()


@pytest.mark.skipif(not compile_available(), reason="torch.compile needs a C++ compiler on the CPU")
def test_fused_dequant_compiled_matches_reference(tiny_model):
    """The compiled batch-1 step of an int8, an int4 and a bf16-weight model (where the kernel is meant to
    run) gives the reference kernel's greedy tokens and logits to float rounding; each is frozen, its
    conversions kept (test_frozen_step_reads_the_codes), and a short prompt is prefilled by steps."""
    prompt = torch.tensor([[1, 2, 3, 4]])
    for method in ("int8", "int4", "bf16"):
        ref = quantize_model(tiny_model, method, 32, kernel="reference")
        fast = FastGenerator(quantize_model(tiny_model, method, 32, kernel="fused_dequant"), max_seq_len=24)
        assert fast.freeze and fast.prefill_steps >= prompt.shape[1]
        assert fast.warmup() > 0 and fast.compiled
        assert torch.equal(fast.generate(prompt, 12), generate(ref, prompt, 12))
        with torch.no_grad():
            prefill(fast.decode_model, prompt, fast.cache)
            ref_cache = KVCache.for_model(ref, max_seq_len=24)
            prefill(ref, prompt, ref_cache)
            expected = decode_one_token(ref, torch.tensor([[5]]), ref_cache)  # (1, V)
        got = fast.step(torch.tensor([[5]]), torch.tensor([4]))
        assert (got - expected).abs().max() <= 1e-4 * expected.abs().max()


@pytest.mark.skipif(not compile_available(), reason="torch.compile needs a C++ compiler on the CPU")
@pytest.mark.parametrize("kept", [True, False])
def test_frozen_step_reads_the_codes(kept):
    """Frozen under compiling.conversions_kept, an int8 layer's generated code reads its int8 codes; frozen
    without it, constant folding has turned them into float32 weights (no int8 left in the code)."""
    layer = QuantizedLinear(torch.randn(64, 64), "int8", kernel="fused_dequant").eval()
    x = torch.randn(1, 64)
    fn = torch.compile(layer, options={"freezing": True, "fx_graph_cache": False})
    with torch.no_grad(), torch._inductor.config.patch(freezing=True):
        with conversions_kept() if kept else contextlib.nullcontext():
            out, code = run_and_get_code(fn, x)
    assert ("int8_t" in "\n".join(code)) == kept
    assert (out - layer(x)).abs().max() <= 1e-5 * out.abs().max()


DYNAMIC = "dynamic" in available_kernels("int8", "cpu")


@pytest.mark.skipif(not DYNAMIC, reason="fbgemm's dynamic int8 kernel exists only on x86 CPUs")
def test_dynamic_int8_weight_bits_follow_the_kernel():
    """7-bit weight codes exactly where the kernel's int16 pair sums saturate, 8 bits elsewhere."""
    assert dynamic_weight_bits() == (7 if dynamic_int8_saturates() else 8)
    layer = QuantizedLinear(torch.randn(16, 64), "int8", kernel="dynamic")
    q = layer.dynamic_codes()
    assert q.abs().max().item() == 2 ** (dynamic_weight_bits() - 1) - 1


SATURATING_CHECK = """
import torch, torch.nn as nn
from helpers.quantize import QuantizedLinear, dynamic_int8_saturates, dynamic_weight_bits, quantize_absmax
from helpers.quantize import prepack_dynamic
from test_quantize import emulate_dynamic_activation_quant
assert dynamic_int8_saturates() and dynamic_weight_bits() == 7
torch.manual_seed(0)
w, x = torch.randn(256, 256) * 0.05, torch.randn(16, 256)
layer = QuantizedLinear(w, "int8", kernel="dynamic")
expected = emulate_dynamic_activation_quant(x) @ layer.dequantized_weight().T
assert (layer(x) - expected).abs().max() <= 1e-4 * expected.abs().max()
q8, s8 = quantize_absmax(w, bits=8, per_channel=True, scale_dtype=torch.bfloat16)  # what would go wrong
y8 = torch.ops.quantized.linear_dynamic(x, prepack_dynamic(q8, s8.reshape(-1)), False)
ideal8 = emulate_dynamic_activation_quant(x) @ (q8.float() * s8.float()).T
assert (y8 - ideal8).abs().max() > 100 * 1e-4 * ideal8.abs().max()
print("ok")
"""


@pytest.mark.skipif(not DYNAMIC, reason="fbgemm's dynamic int8 kernel exists only on x86 CPUs")
def test_dynamic_int8_is_exact_on_a_saturating_kernel():
    """FBGEMM_ENABLE_INSTRUCTIONS=AVX2 makes fbgemm use its AVX2 kernel on any x86 CPU: there 8-bit codes
    would saturate (error > 100x the ideal) and the chosen 7-bit codes give the ideal rounding."""
    import os
    import subprocess
    import sys

    from helpers.paths import REPO

    env = {**os.environ, "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), str(REPO), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", SATURATING_CHECK], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


ENGINE_ORDER_CHECK = """
import torch
from helpers.quantize import QuantizedLinear, dynamic_int8_saturates
engines = torch.backends.quantized.supported_engines
assert "qnnpack" in engines and "x86" in engines
torch.backends.quantized.engine = "qnnpack"
assert not dynamic_int8_saturates()  # asked first under qnnpack, which does not saturate
torch.backends.quantized.engine = "x86"
assert dynamic_int8_saturates()  # decided for x86 on its own, not remembered from qnnpack
torch.manual_seed(0)
w, x = torch.randn(256, 256) * 0.05, torch.randn(16, 256)
layer = QuantizedLinear(w, "int8", kernel="dynamic")
ref = x @ w.T
print(layer.weight_bits, float((layer(x) - ref).abs().max() / ref.abs().max()))
"""


@pytest.mark.skipif(
    not DYNAMIC or "qnnpack" not in torch.backends.quantized.supported_engines,
    reason="needs fbgemm's dynamic int8 kernel and qnnpack (x86 CPUs)",
)
def test_the_saturation_guard_is_decided_per_quantized_engine():
    """On the AVX2 kernel, a first question asked under qnnpack must not give x86 layers 8-bit codes (their
    error was 0.155 of the output's range, against 0.018 with the 7-bit guard)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "-c", ENGINE_ORDER_CHECK], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    bits, err = run.stdout.split()
    assert bits == "7" and float(err) < 0.05, run.stdout


def test_reference_layer_is_dequantize_then_matmul():
    torch.manual_seed(0)
    linear = nn.Linear(256, 128, bias=False)
    x = torch.randn(4, 256)
    for method in ("int8", "int4"):
        layer = QuantizedLinear.from_linear(linear, method, 64, kernel="reference")
        assert torch.allclose(layer(x), x @ layer.dequantized_weight().T, atol=1e-6)
        err = (layer.dequantized_weight() - linear.weight).abs().max()
        assert 0 < err < (0.02 if method == "int8" else 0.1) * linear.weight.abs().max()


@pytest.mark.parametrize("method", ["bf16", "fp16"])
def test_float_formats_store_the_rounded_weight(method):
    """bf16/fp16: the weight itself, rounded to that format (2 bytes, no scales); the arithmetic stays in
    float32, so every kernel equals x @ w16.float().T, one row (the fused loop) or several."""
    fmt = {"bf16": torch.bfloat16, "fp16": torch.float16}[method]
    w = weights(44, 96, seed=5)
    kernels = ["reference", "fused_dequant"] + (["cpu_rows"] if native.buildable() else [])  # cpu_rows: C++
    assert available_kernels(method, "cpu") == kernels
    layer = QuantizedLinear(w, method)
    assert layer.kernel == "fused_dequant" and layer.qweight.dtype == fmt and layer.weight_bits == 16
    assert torch.equal(layer.dequantized_weight(), w.to(fmt).float())
    assert layer.nbytes() == {"weights": 44 * 96 * 2, "scales": 0, "zeros": 0}
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(6))
    expected = x @ w.to(fmt).float().T  # (3, 44)
    for kernel in kernels:
        lay = QuantizedLinear(w, method, kernel=kernel)
        assert torch.equal(lay.dequantized_weight(), w.to(fmt).float())
        for rows in (x[:1], x):  # the single-row loop and the several-row path
            y = lay(rows)
            assert y.dtype == torch.float32
            assert (y - expected[: len(rows)]).abs().max() <= 1e-5 * expected.abs().max()
    assert 0 < (layer.dequantized_weight() - w).abs().max() <= 2.0**-8 * w.abs().max()  # bf16 or fp16 rounding


# --- whole models ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model():
    return random_model(TINY, seed=1, std=0.1)


@pytest.mark.parametrize("method,group_size", [("int8", 64), ("int4", 32), ("int4", 64)])
def test_quantized_model_logits_match_reference_model(tiny_model, method, group_size):
    idx = torch.randint(0, TINY.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = quantize_model(tiny_model, method, group_size, kernel="reference")(idx)
        fast = quantize_model(tiny_model, method, group_size)(idx)  # kernel="auto"
    assert (fast - ref).abs().max().item() <= 0.1


def test_shipped_model_quantized_logits(shipped):
    target, _, tok = shipped
    idx = torch.tensor([tok.encode("import os\nimport sys\n\n\ndef main(argv):\n    for name in argv:\n", bos=True)])
    with torch.no_grad():
        full = target(idx)
        for method, g in [("int8", 64), ("int4", 64)]:
            ref = quantize_model(target, method, g, kernel="reference")(idx)
            fast = quantize_model(target, method, g)(idx)
            assert (fast - ref).abs().max().item() <= 0.1
            # quantization moves the logits, but not by much: the best token rarely changes
            assert (ref.argmax(-1) == full.argmax(-1)).float().mean().item() >= 0.8


def test_quantize_model_copies_and_replaces_the_right_layers(tiny_model):
    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    q = quantize_model(tiny_model, "int4", 32)
    for name, v in tiny_model.state_dict().items():  # the original is untouched
        assert torch.equal(v, before[name])
    quantized = {n for n, m in q.named_modules() if isinstance(m, QuantizedLinear)}
    expected = {
        f"layers.{i}.{name}"
        for i in range(TINY.n_layers)
        for name in ("attn.wqkv", "attn.wo", "mlp.w_gate_up", "mlp.w_down")
    }
    assert quantized == expected
    assert isinstance(q.head, nn.Linear) and q.head.weight is q.embed.weight  # still tied, full precision
    assert q.quantization == {
        "method": "int4",
        "group_size": 32,
        "kernel": "int4pack",
        "quantize_head": False,
        "head": None,
    }


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantized_model_generates(tiny_model, method):
    q = quantize_model(tiny_model, method, 32)
    out = generate(q, [1, 2, 3], max_new_tokens=12)
    assert out.shape == (1, 15)
    assert 0 <= out.min() and out.max() < TINY.vocab_size
    ref = generate(quantize_model(tiny_model, method, 32, kernel="reference"), [1, 2, 3], max_new_tokens=12)
    assert (out == ref).float().mean() >= 0.75  # bf16 activations may flip a near-tie


def test_quantize_head(tiny_model):
    q = quantize_model(tiny_model, "int8", quantize_head=True)
    assert isinstance(q.head, QuantizedLinear) and isinstance(q.embed, nn.Embedding)
    assert torch.equal(q.embed.weight, tiny_model.embed.weight)
    idx = torch.randint(0, TINY.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (q(idx) - tiny_model(idx)).abs().max() < 0.5


def test_bytes_accounting():
    cfg = ModelConfig.from_preset("target")
    model = random_model(cfg)
    C, F, V = cfg.d_model, cfg.d_ff, cfg.vocab_size
    shapes = [(C + 2 * cfg.n_kv_heads * cfg.head_dim, C), (C, C), (2 * F, C), (C, F)] * cfg.n_layers  # (N, K)
    full_precision = (V * C + (2 * cfg.n_layers + 1) * C) * 4  # tied embedding/head + norms, fp32
    fp32 = weight_bytes_breakdown(model)
    assert fp32 == {
        "weights": 0,
        "scales": 0,
        "zeros": 0,
        "full_precision": model.num_parameters() * 4,
        "total": model.num_parameters() * 4,
    }
    int8 = weight_bytes_breakdown(quantize_model(model, "int8"))
    assert int8["weights"] == sum(N * K for N, K in shapes)
    assert int8["scales"] == sum(N * 2 for N, K in shapes) and int8["zeros"] == 0
    assert int8["full_precision"] == full_precision
    int4 = weight_bytes_breakdown(quantize_model(model, "int4", 64))
    assert int4["weights"] == sum(N * K // 2 for N, K in shapes)
    assert int4["scales"] == int4["zeros"] == sum(N * K // 64 * 2 for N, K in shapes)
    assert int4["total"] == int4["weights"] + 2 * int4["scales"] + full_precision


# --- bad input -------------------------------------------------------------------------------


def test_bad_input_raises_value_error(tiny_model):
    w = torch.randn(16, 64)
    with pytest.raises(ValueError, match="bits"):
        quantize_absmax(w, bits=9)
    with pytest.raises(ValueError, match="bits"):
        quantize_groupwise(w, bits=1)
    with pytest.raises(ValueError, match="2-D"):
        quantize_absmax(torch.randn(64))
    with pytest.raises(ValueError, match="finite"):
        quantize_absmax(torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(ValueError, match="floating-point"):
        quantize_groupwise(torch.ones(4, 64, dtype=torch.long))
    with pytest.raises(ValueError, match="group_size"):
        quantize_groupwise(w, group_size=48)  # does not divide 64
    with pytest.raises(ValueError, match="method"):
        quantize_model(tiny_model, "int3")
    with pytest.raises(ValueError, match="group_size"):
        quantize_model(tiny_model, "int4", group_size=16)  # the kernels take 32, 64, 128, 256
    with pytest.raises(ValueError, match="kernel"):
        quantize_model(tiny_model, "int8", kernel="fastest")
    with pytest.raises(ValueError, match="already quantized"):
        quantize_model(quantize_model(tiny_model, "int8"), "int4")
    with pytest.raises(ValueError, match="kernel"):
        QuantizedLinear(w, "int8", kernel="int4pack")  # an int4 kernel for int8 weights
    with pytest.raises(ValueError, match="bias"):
        QuantizedLinear.from_linear(nn.Linear(64, 16, bias=True))
    with pytest.raises(ValueError, match="in_features"):
        QuantizedLinear(torch.randn(16, 48), "int4", group_size=32)  # 48 is not a multiple of 32
    with pytest.raises(ValueError, match="in_features=64"):
        QuantizedLinear(w, "int8")(torch.randn(2, 32))
    with pytest.raises(ValueError, match="kernel='reference'"):
        QuantizedLinear(w, "int4", 32, kernel="int4pack").dequantized_weight()
    with pytest.raises(ValueError, match="in_features=64"):
        QuantizedLinear(w, "int4", 32, kernel="fused_dequant")(torch.randn(32))
    with pytest.raises(ValueError, match="group_size"):
        QuantizedLinear(w, "int4", 48, kernel="fused_dequant")
    with pytest.raises(ValueError, match="even"):
        pack_int4_halves(torch.zeros(2, 9, dtype=torch.uint8), 3)
    with pytest.raises(ValueError, match=r"\[0, 15\]"):
        pack_int4_halves(torch.full((2, 8), 16, dtype=torch.uint8), 4)


# --- CUDA (skipped without a GPU) ------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("N,K", [(768, 256), (256, 704), (4096, 4096)])
@pytest.mark.parametrize("method,group_size", [("int8", None), ("int4", 32), ("int4", 64), ("int4", 128)])
def test_cuda_kernels_match_reference(N, K, method, group_size):
    if group_size and K % group_size:
        pytest.skip("group size does not divide K")
    torch.manual_seed(0)
    linear = nn.Linear(K, N, bias=False).cuda().to(torch.bfloat16)
    x = torch.randn(7, K, device="cuda", dtype=torch.bfloat16)
    reference = QuantizedLinear.from_linear(linear, method, group_size or 64, kernel="reference")
    expected = x.float() @ reference.dequantized_weight(torch.float32).T  # (7, N)
    for kernel in [k for k in available_kernels(method, "cuda") if k != "reference"]:
        y = QuantizedLinear.from_linear(linear, method, group_size or 64, kernel=kernel)(x)
        assert y.dtype == torch.bfloat16 and y.shape == (7, N)
        rel = ((y.float() - expected).norm() / expected.norm()).item()
        assert rel <= 2e-2, f"{kernel}: relative error {rel:.3g}"


@pytest.mark.cuda
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_cuda_quantized_model_generates(method):
    model = random_model(TINY, seed=1, std=0.1).cuda().to(torch.bfloat16)
    q = quantize_model(model, method, 32)
    idx = torch.randint(0, TINY.vocab_size, (2, 32), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    with torch.no_grad():
        ref = quantize_model(model, method, 32, kernel="reference")(idx).float()
        assert (q(idx).float() - ref).abs().max().item() <= 0.25  # bf16 logits of magnitude ~ 3
    out = generate(q, [1, 2, 3], max_new_tokens=12)
    assert out.shape == (1, 15) and out.device.type == "cuda"


@pytest.mark.cuda
def test_cuda_layer_refuses_cpu_input():
    layer = QuantizedLinear(torch.randn(64, 64, device="cuda"), "int4", 32)
    with pytest.raises(ValueError, match="device"):
        layer(torch.randn(2, 64))


def test_only_the_known_detach_copy_fallback_warning_is_dropped():
    """row_sums.materialized's aten.detach_copy runs through inductor's proxy executor on purpose: that one warning
    goes, every other inductor warning still reaches the learner."""
    import logging

    import helpers.quantize  # noqa: F401  (installs the filter)

    seen = []

    class Collect(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    log = logging.getLogger("torch._inductor.ir")
    handler = Collect(level=logging.WARNING)
    log.addHandler(handler)
    message = "%s is missing a c-shim implementation, using proxy executor as fallback"  # inductor's, ir.py
    try:
        log.warning(message, "aten.detach_copy.default")
        log.warning(message, "aten.some_other.default")
    finally:
        log.removeHandler(handler)
    assert seen == ["aten.some_other.default is missing a c-shim implementation, using proxy executor as fallback"]
