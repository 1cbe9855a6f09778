"""The course's C++ kernels (helpers/quantize/cpu_kernels.cpp): int4 codes times activations rounded to int8
("dynamic"), and int8 weight-only over rows interleaved by four ("cpu_rows").

Both loops of each (the vector one where the CPU has its instructions, the scalar one anywhere) against a
plain-torch reference of the same arithmetic: for int4, int4_dynamic.reference_mm (the integer sums are exact,
so only the float sums' order differs: <= 1e-5 * max|y|, measured about 4e-7); for int8, the float64 product
(<= 1e-5 * max|y|). Also: the rounding against its definition, the interleaved layout undone, the dequantized
weight bit for bit, the layer's paths (few rows by the kernel, many by one GEMM, a gradient through a fresh
buffer), and compiled decode steps against the eager layers. Where no C++ compiler is found the kernels are not
listed, which one test checks by hiding the compiler.
"""

from __future__ import annotations

import pytest
import torch
from conftest import random_model

from helpers import many_rows
from helpers.fast_decode import FastGenerator, compile_available
from helpers.generate import generate
from helpers.model import ModelConfig
from helpers.quantize import QuantizedLinear, available_kernels, int4_dynamic, native, quantize_model
from helpers.quantize.arithmetic import pack_int4_halves, quantize_groupwise

BUILDABLE = native.buildable()  # x86-64 and a C++ compiler: there the kernels must build (test_builds_...)
needs_kernel = pytest.mark.skipif(not BUILDABLE, reason="no C++ compiler, or not an x86-64 CPU")


def test_builds_where_a_compiler_is_found():
    if BUILDABLE:
        assert native.load() is None, native.load()


def codes_of(N, K, g, seed=0):
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(seed))
    q, s, z = quantize_groupwise(w, bits=4, group_size=g, scale_dtype=torch.bfloat16)
    return q, int4_dynamic.pack(q, g), s, z


@pytest.mark.parametrize("N,K,g", [(8, 704, 64), (11, 256, 64), (6, 384, 128), (3, 128, 64)])
def test_interleaving_rows_is_undone(N, K, g):
    q, codes, _, _ = codes_of(N, K, g)
    plain = pack_int4_halves(q, g)
    assert torch.equal(native.deinterleave_rows(codes), plain)
    if N >= native.ROWS_AT_ONCE:  # a whole block: its second row's first 64 bytes follow the first row's
        flat = codes.reshape(N, -1).flatten()
        assert torch.equal(flat[64:128], plain.reshape(N, -1)[1, :64])


def test_listed_only_with_a_compiler(monkeypatch):
    assert ("dynamic" in available_kernels("int4", "cpu")) == native.buildable()
    assert ("cpu_rows" in available_kernels("int8", "cpu")) == native.buildable()
    monkeypatch.setattr(native, "compiler", lambda: None)
    assert "dynamic" not in available_kernels("int4", "cpu") and "cpu_rows" not in available_kernels("int8", "cpu")
    assert "no C++ compiler" in native.load.__wrapped__()  # what a layer asking for it is told


@needs_kernel
@pytest.mark.parametrize(
    "N,K,g,M",
    [
        (256, 704, 64, 1),  # the course model's w_down: 11 groups, the last unit half full
        (384, 256, 64, 3),
        (42, 2816, 64, 1),  # 44 groups: three blocks of 16, the last of 12; 42 rows: two left after the blocks
        (16, 384, 128, 2),
        (23, 512, 256, 5),
    ],
)
@pytest.mark.parametrize("vnni", [False, True])
def test_both_loops_match_the_reference(N, K, g, M, vnni):
    if vnni and not torch.ops.course_quant.has_vnni():
        pytest.skip("this CPU has no AVX512-VNNI")
    _, codes, s, z = codes_of(N, K, g)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(1)) * 3
    x[0, :g] = 0  # an all-zero group rounds to zeros, not NaN
    expected = int4_dynamic.reference_mm(x, codes, s, z, g)
    y = torch.ops.course_quant.int4_dynamic_mm(x, codes, s, z, g, vnni)
    assert y.shape == (M, N) and torch.isfinite(y).all()
    assert (y - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_rounding_is_absmax_per_group():
    x = torch.tensor([[0.5, -1.0, 0.25, 0.0, 2.0, 1.0, -0.5, 0.0]])
    a, d = int4_dynamic.round_activations(x, 4)
    assert torch.equal(d, torch.tensor([[1.0 / 127, 2.0 / 127]]))
    assert torch.equal(a, torch.tensor([[64.0, -127.0, 32.0, 0.0, 127.0, 64.0, -32.0, 0.0]]))  # 63.5 -> 64 (even)
    assert (a * d.repeat_interleave(4, dim=1) - x).abs().max() <= d.max() / 2


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_is_the_reference_weight(dtype):
    q, codes, s, z = codes_of(72, 704, 64, seed=2)
    expected = ((q.float().reshape(72, 11, 64) - 8) * s.float().unsqueeze(-1) + z.float().unsqueeze(-1)).reshape(
        72, 704
    )
    out = int4_dynamic.dequantize(codes, s, z, 64, torch.empty(72, 704, dtype=dtype))
    assert torch.equal(out, expected.to(dtype))  # bf16: rounded once, to nearest even, as .to() does


@needs_kernel
def test_layer_rounds_few_rows_and_multiplies_many_by_one_gemm():
    w = torch.randn(128, 256, generator=torch.Generator().manual_seed(3))
    layer = QuantizedLinear(w, "int4", group_size=64, kernel="dynamic")
    ref = QuantizedLinear(w, "int4", group_size=64, kernel="reference")
    assert torch.equal(layer.dequantized_weight(), ref.dequantized_weight())  # the same codes
    few = torch.randn(2, 8, 256)  # 16 rows: rounded
    rounded = int4_dynamic.reference_mm(few.reshape(16, 256), layer.qweight, layer.scales, layer.zeros, 64)
    assert (layer(few).reshape(16, 128) - rounded).abs().max() <= 1e-5 * rounded.abs().max()
    many = torch.randn(40, 256)  # more than rounded_rows: the dequantized weight, activations as they are
    exact = many @ ref.dequantized_weight().t()
    bound = (2**-7 if many_rows.BF16_FAST else 1e-5) * exact.abs().max()  # bf16 GEMM where the CPU has bf16
    assert (layer(many) - exact).abs().max() <= bound
    grad_in = many.clone().requires_grad_()  # a gradient: a fresh weight buffer, and it flows to the input
    layer(grad_in).sum().backward()
    assert grad_in.grad is not None and torch.isfinite(grad_in.grad).all()


def test_group_size_the_kernel_cannot_read_is_named():
    with pytest.raises(ValueError, match="group_size must be 64 or a multiple of 128"):
        int4_dynamic.check_group_size(32)


@needs_kernel
@pytest.mark.skipif(not compile_available(), reason="torch.compile needs a C++ compiler on the CPU")
def test_compiled_step_calls_the_kernel_and_matches_eager():
    """The decode step compiled around the operator gives the eager model's greedy tokens; rows of a prompt
    (more than rounded_rows) take the GEMM, the steps the kernel."""
    model = random_model(
        ModelConfig(vocab_size=256, max_seq_len=64, n_layers=2, d_model=128, n_heads=4, n_kv_heads=2, d_ff=256)
    )
    qmodel = quantize_model(model, "int4", group_size=64, kernel="dynamic")
    assert qmodel.quantization["kernel"] == "dynamic"
    fast = FastGenerator(qmodel, max_seq_len=48)
    assert fast.warmup() > 0 and fast.compiled
    prompt = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(5))
    assert torch.equal(fast.generate(prompt, 16), generate(qmodel, prompt, 16))
    assert native.MAX_ROWS < prompt.shape[1]


@needs_kernel
@pytest.mark.parametrize("N,K,M", [(256, 704, 1), (42, 1024, 3), (8, 64, 16), (5, 128, 2)])
@pytest.mark.parametrize("vector", [False, True])
def test_int8_rows_both_loops_match_the_product(N, K, M, vector):
    if vector and not torch.ops.course_quant.has_avx512():
        pytest.skip("this CPU has no AVX-512")
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(6))
    layer = QuantizedLinear(w, "int8", kernel="cpu_rows")
    ref = QuantizedLinear(w, "int8", kernel="reference")
    assert torch.equal(layer.dequantized_weight(), ref.dequantized_weight())  # the same codes, deinterleaved
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(7))
    expected = (x.double() @ ref.dequantized_weight().double().t()).float()
    y = torch.ops.course_quant.int8_rows_mm(x, layer.qweight, layer.scales, vector)
    assert (y - expected).abs().max() <= 1e-5 * expected.abs().max()


@needs_kernel
def test_int8_rows_layer_takes_the_gemm_for_many_rows():
    layer = QuantizedLinear(torch.randn(64, 128), "int8", kernel="cpu_rows")
    x = torch.randn(native.MAX_ROWS + 1, 128)
    expected = x @ layer.dequantized_weight().t()
    assert (layer(x) - expected).abs().max() <= 1e-5 * expected.abs().max()
    with pytest.raises(ValueError, match="in_features \\(96\\) must be a multiple of 64"):
        QuantizedLinear(torch.randn(8, 96), "int8", kernel="cpu_rows")


@needs_kernel
@pytest.mark.skipif(not compile_available(), reason="torch.compile needs a C++ compiler on the CPU")
def test_int8_rows_compiled_step_matches_eager():
    model = random_model(
        ModelConfig(vocab_size=256, max_seq_len=64, n_layers=2, d_model=128, n_heads=4, n_kv_heads=2, d_ff=256)
    )
    qmodel = quantize_model(model, "int8", kernel="cpu_rows")
    fast = FastGenerator(qmodel, max_seq_len=48)
    assert fast.freeze and fast.warmup() > 0 and fast.compiled
    prompt = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(8))
    assert torch.equal(fast.generate(prompt, 16), generate(qmodel, prompt, 16))


@needs_kernel
@pytest.mark.parametrize("method", ["fp16", "bf16"])
@pytest.mark.parametrize("vector", [False, True])
def test_16_bit_rows_both_loops_match_the_product(method, vector):
    if vector and not torch.ops.course_quant.has_avx512():
        pytest.skip("this CPU has no AVX-512")
    w = torch.randn(42, 352, generator=torch.Generator().manual_seed(9))  # 10 blocks of four rows and two more
    layer = QuantizedLinear(w, method, kernel="cpu_rows")
    w16 = layer.dequantized_weight()
    assert torch.equal(w16, QuantizedLinear(w, method, kernel="reference").dequantized_weight())
    x = torch.randn(3, 352, generator=torch.Generator().manual_seed(10))
    expected = (x.double() @ w16.double().t()).float()
    y = torch.ops.course_quant.float16_rows_mm(x, layer.qweight, vector)
    assert (y - expected).abs().max() <= 1e-5 * expected.abs().max()
