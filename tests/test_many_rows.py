"""many_rows.linear: oneDNN's GEMM for many float32 rows on a CPU, F.linear otherwise."""

import pytest
import torch
import torch.nn.functional as F

from helpers import many_rows
from helpers.model import Linear

needs_onednn = pytest.mark.skipif(
    not many_rows.ONEDNN_FAST, reason="oneDNN is taken on x86 CPUs with AVX2 or AVX-512 and oneDNN built in"
)


@pytest.mark.parametrize(
    "machine, capability, onednn_isa, fast",
    [
        ("x86_64", "AVX512", None, True),
        ("x86_64", "AVX2", "AVX2", True),
        ("x86_64", "DEFAULT", None, False),  # ATEN_CPU_CAPABILITY=default, the restricted-CPU run
        ("x86_64", "AVX512", "SSE41", False),  # oneDNN held to SSE4.1: 0.4x of F.linear when measured
        ("aarch64", "SVE256", None, False),
    ],
)
def test_onednn_is_taken_only_where_it_may_vectorise(monkeypatch, machine, capability, onednn_isa, fast):
    monkeypatch.setattr(many_rows.platform, "machine", lambda: machine)
    monkeypatch.setattr(many_rows.torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(many_rows.torch.backends.mkldnn, "is_available", lambda: True)
    if onednn_isa is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", onednn_isa)
    assert many_rows.onednn_is_fast() is fast


@needs_onednn
@pytest.mark.parametrize("lead", [(many_rows.MIN_ROWS,), (2, many_rows.MIN_ROWS + 3), (1, 512)])
def test_many_rows_equal_f_linear_to_rounding(lead):
    torch.manual_seed(0)
    x, w = torch.randn(*lead, 96), torch.randn(40, 96)
    with torch.no_grad():
        y = many_rows.linear(x, w)
    assert y.shape == (*lead, 40) and y.dtype == torch.float32
    torch.testing.assert_close(y, F.linear(x, w), rtol=1e-5, atol=1e-4)


@needs_onednn
def test_the_onednn_path_is_taken_only_where_it_applies(monkeypatch):
    calls = []
    real = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(many_rows.torch.ops.mkldnn, "_linear_pointwise", lambda *a: calls.append(1) or real(*a))
    w = torch.randn(8, 16)
    many_rows.linear(torch.randn(many_rows.MIN_ROWS, 16), w)
    assert len(calls) == 1
    many_rows.linear(torch.randn(many_rows.MIN_ROWS - 1, 16), w)  # few rows: the library's kernel
    many_rows.linear(torch.randn(many_rows.MIN_ROWS, 16, dtype=torch.float64), w.double())  # not float32
    many_rows.linear(torch.randn(many_rows.MIN_ROWS, 16, requires_grad=True), w)  # a gradient to record
    assert len(calls) == 1


def test_a_model_linear_trains_and_keeps_nn_linear_state():
    layer = Linear(16, 8, bias=False)
    assert isinstance(layer, torch.nn.Linear) and list(layer.state_dict()) == ["weight"]
    x = torch.randn(many_rows.MIN_ROWS, 16)
    layer(x).sum().backward()  # the weight requires grad: F.linear, which has a backward
    torch.testing.assert_close(layer.weight.grad, x.sum(0).expand(8, 16))


def test_a_flop_counter_sees_the_matmul():
    from torch.utils.flop_counter import FlopCounterMode

    x, w = torch.randn(many_rows.MIN_ROWS, 16), torch.randn(8, 16)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        many_rows.linear(x, w)
    assert counter.get_total_flops() == 2 * many_rows.MIN_ROWS * 16 * 8


def test_no_torch_calls_are_added_for_one_row():
    from helpers.measure.profiling import count_torch_calls

    x, w = torch.randn(1, 16), torch.randn(8, 16)
    assert count_torch_calls(lambda: many_rows.linear(x, w)) == count_torch_calls(lambda: F.linear(x, w))


@pytest.mark.parametrize(
    "capability, flags, onednn_isa, fast",
    [
        ("AVX512", {"avx512f", "avx512_bf16"}, None, True),
        ("AVX512", {"avx512f", "amx_bf16"}, None, True),
        ("AVX512", {"avx512f"}, None, False),  # oneDNN would emulate bf16
        ("AVX2", {"avx2", "avx512_bf16"}, None, False),
        ("AVX512", {"avx512f", "avx512_bf16"}, "AVX512_CORE", False),  # oneDNN held below its bf16 code
    ],
)
def test_bf16_is_fast_only_with_bf16_instructions(monkeypatch, capability, flags, onednn_isa, fast):
    monkeypatch.setattr(many_rows, "ONEDNN_FAST", True)
    monkeypatch.setattr(many_rows.torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(many_rows, "_cpu_flags", lambda: flags)
    if onednn_isa is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", onednn_isa)
    assert many_rows.bf16_is_fast() is fast


needs_bf16 = pytest.mark.skipif(not many_rows.BF16_FAST, reason="taken where oneDNN multiplies in bf16 instructions")


@needs_bf16
def test_int4_many_rows_dequantize_to_the_kernels_values(monkeypatch):
    from helpers.quantize import linear as qlinear
    from helpers.quantize.linear import QuantizedLinear

    torch.manual_seed(0)
    w = torch.randn(128, 256) * 0.05
    layer = QuantizedLinear(w, "int4", group_size=64)
    assert layer.kernel == "int4pack" and layer._dequantizes_many_rows
    reference = QuantizedLinear(w, "int4", group_size=64, kernel="reference")
    # the packed codes read back are the reference layer's codes, and so is the whole dequantized weight
    codes = qlinear.arithmetic.unpack_int4(reference.qweight)  # (N, K) uint8
    assert torch.equal(qlinear.unpack_int4pack_cpu(layer.qweight, 128).t(), codes)
    w_t = qlinear.dequantize_int4pack_cpu(layer.qweight, layer.scales_and_zeros, 64)  # (K, N) bf16
    assert torch.equal(w_t.t(), reference.dequantized_weight(torch.float32).to(torch.bfloat16))
    calls = []
    real = qlinear.dequantize_int4pack_cpu
    monkeypatch.setattr(qlinear, "dequantize_int4pack_cpu", lambda *a: calls.append(1) or real(*a))
    many = torch.randn(2, qlinear.INT4_DEQUANTIZE_MIN_ROWS // 2, 256)  # rows counted over the leading dims
    few = torch.randn(qlinear.INT4_DEQUANTIZE_MIN_ROWS - 1, 256)
    with torch.no_grad():
        y_many, y_few = layer(many), layer(few)
    assert len(calls) == 1 and y_many.shape == (2, qlinear.INT4_DEQUANTIZE_MIN_ROWS // 2, 128)
    kernel = torch.ops.aten._weight_int4pack_mm_for_cpu(
        many.reshape(-1, 256).bfloat16(), layer.qweight, 64, layer.scales_and_zeros
    ).float()
    # both multiply bf16 activations and sum in float32 into bf16 outputs; the kernel keeps each dequantized
    # weight in float32 where this path rounds it to bf16: equal to a few units of the outputs' bf16 rounding
    torch.testing.assert_close(y_many.reshape(-1, 128), kernel, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(y_many, reference(many), rtol=2e-2, atol=2e-2)
    assert y_few.shape == (qlinear.INT4_DEQUANTIZE_MIN_ROWS - 1, 128)
    # a gradient to record: the kernel, as before (its backward is not implemented, which it says), never a
    # product whose saved weight is a workspace the next call overwrites
    with pytest.raises(RuntimeError, match="derivative"):
        layer(many.clone().requires_grad_()).sum().backward()
    assert len(calls) == 1
