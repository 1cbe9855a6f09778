"""fbgemm's dynamic int8 linear on a CPU: packing codes for it, and whether its u8 x s8 kernel saturates.

See helpers.quantize.linear's docstring ("dynamic") for why 7-bit codes are used where it does.
"""

from __future__ import annotations

import functools
import warnings

import torch


def prepack_dynamic(q: torch.Tensor, scales: torch.Tensor):
    """(N, K) int8 codes and (N,) per-row scales -> fbgemm's packed weight for torch.ops.quantized.linear_dynamic
    (CPU only). It packs whatever codes it is given: QuantizedLinear(kernel="dynamic") gives it codes of
    dynamic_weight_bits() bits; chapter 11 gives it 8-bit codes to show the kernel saturating."""
    N = q.shape[0]
    with warnings.catch_warnings():  # torch >= 2.10 flags quantized tensors as deprecated; the op still ships
        warnings.simplefilter("ignore")
        qw = torch._make_per_channel_quantized_tensor(
            q.cpu(), scales.double().cpu(), torch.zeros(N, dtype=torch.long), 0
        )
        return torch.ops.quantized.linear_prepack(qw, None)


def dynamic_int8_saturates(engine: str | None = None) -> bool:
    """Does fbgemm's dynamic int8 kernel saturate its int16 pair sums on this CPU? Asked of the kernel itself.

    engine: a torch.backends.quantized engine ("x86", "fbgemm", "qnnpack", ...); default the active one,
    which is the one a layer packed now runs on (packed weights keep the engine they were packed for). The
    answer is remembered per engine, not once per process: a first call under qnnpack must not decide
    for the x86 kernel.

    Every weight code is 127 and every activation is 1.0, which fbgemm rounds to the uint8 code 255, so
    each pair of products is 2 x 255 x 127 = 64,770. A VNNI kernel (`vpdpbusd`) accumulates in int32
    and returns 64 x 127 exactly; an AVX2 kernel (`vpmaddubsw`) clips every pair at 32,767 and returns
    about half. fbgemm picks its kernel from the CPU (or FBGEMM_ENABLE_INSTRUCTIONS), not from
    ATEN_CPU_CAPABILITY, so only running it tells. False where the kernel is not available."""
    return _saturates(torch.backends.quantized.engine if engine is None else engine)


@functools.cache
def _saturates(engine: str) -> bool:
    if (
        engine == "none"
        or engine not in torch.backends.quantized.supported_engines
        or not set(torch.backends.quantized.supported_engines) & {"fbgemm", "x86"}
    ):
        return False
    active = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine  # the probe packs and runs under the engine asked about
    try:
        K, N = 64, 8
        packed = prepack_dynamic(torch.full((N, K), 127, dtype=torch.int8), torch.ones(N))
        y = torch.ops.quantized.linear_dynamic(torch.ones(1, K), packed, False)  # (1, N)
    finally:
        torch.backends.quantized.engine = active
    return abs(y[0, 0].item() - 127 * K) > 0.5


def dynamic_weight_bits(engine: str | None = None) -> int:
    """Bits of the weight codes the "dynamic" kernel gets under `engine` (default: the active one): 8 where
    the kernel is exact, 7 where its int16 pair sums would saturate (see dynamic_int8_saturates)."""
    return 7 if dynamic_int8_saturates(engine) else 8
