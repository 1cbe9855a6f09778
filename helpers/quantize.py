"""Weight-only quantization: the arithmetic by hand, and linear layers that run on torch's real kernels.

The teaching versions are pure functions on a weight matrix `w` of shape (N, K) = (out_features,
in_features), as `nn.Linear` stores it:

    q, scale = quantize_absmax(w, bits=8, per_channel=False)    w ~ q * scale,  q in -127..127
    q, scales, zeros = quantize_groupwise(w, bits=4, group_size=64)
        asymmetric (default): q in 0..15,  w ~ (q - 8) * scale + zero   (one scale and zero per group)
        symmetric:            q in -7..7,  w ~ q * scale                (zeros is None)

Groups are `group_size` consecutive weights along K (the input dimension), which is what the int4
kernels expect. `zero` is the value the middle code 8 stands for, as torch's int4 kernels define it
(about the centre of the group's range), so `dequantize_groupwise` is exactly the kernels' formula.

`QuantizedLinear` is a drop-in replacement for a bias-free `nn.Linear`; `quantize_model` returns a
quantized copy of a course `Transformer`. Besides int8 and int4, the methods "bf16" and "fp16" store
each weight rounded to that 16-bit float format (no scales) while the arithmetic stays in the input's
dtype: half the bytes of float32 weights, with float32 activations. Their kernels are "reference" and
"fused_dequant" (the default): torch has no library kernel that multiplies 16-bit weights by float32
activations, and its all-bf16 kernels were slower than float32 on this CPU (helpers.bench's precision
rows), so the speed comes from the compiled loop. Kernels (`kernel=`):

    "reference"   dequantize the whole weight, then F.linear: the teaching version, any device. It
                  reads the small integers *and* writes and reads a full-precision copy on every call,
                  so it is slower than not quantizing at all.
    "int8pack"    int8: torch.ops.aten._weight_int8pack_mm (weight-only int8; on a CPU it is fast only
                  with bf16 activations, so the input is cast to bf16 and the output back).
    "int4pack"    int4: CPU torch.ops.aten._weight_int4pack_mm_for_cpu, CUDA _weight_int4pack_mm
                  (tinygemm); both read bf16 activations and bf16 scales/zeros.
    "dynamic"     int8, CPU: torch.ops.quantized.linear_dynamic (fbgemm/x86). Not weight-only: it also
                  rounds each call's activations to 8 bits (one scale per call), so its error is larger.
                  On CPUs without VNNI (plain AVX2, and AVX-512 without VNNI) fbgemm multiplies u8 x s8
                  with `vpmaddubsw`, which adds each *pair* of products into a saturating int16: two
                  products of 255 x 127 overflow it. There the weights get 7-bit codes (|q| <= 63),
                  so a pair sum is at most 2 x 255 x 63 = 32,130 < 32,767 and the kernel is exact again;
                  `dynamic_weight_bits()` says which applies on this machine (it asks the kernel).
    "linear_then_scale"  int8: F.linear(x, q.to(x.dtype)) * scale, the form torch.compile fuses into one
                  kernel on a GPU (gpt-fast's weight-only int8). In eager mode it is not fast.
    "fused_dequant"  int8, int4, bf16 or fp16, written for torch.compile: at batch 1 (one input row) the product is
                  an elementwise dequantize-multiply followed by a sum over K, (x * dequant(q)).sum(-1),
                  which inductor generates as one C++ loop per output (load 16 codes, convert, scale,
                  multiply-add) that never writes a full-precision weight. int4 codes are stored two per
                  byte in its own layout (the first and second half of each group share a byte), so the
                  unpacking is two bit operations in that loop. Eager it is slow (the broadcast product
                  is materialized), and inputs of more than one row (prefill, batch > 1) take the
                  "reference" path. The output rows are cut into ROW_SPLIT blocks, each its own sum:
                  inductor runs sums of the same loop shape in one loop with one accumulator each, and a
                  single accumulator's chain of dependent additions held the int8 loop to about 6 GB/s
                  of codes (the fused gate/up product: 0.97 ms for 5.8 MB; the CPU waits on each add),
                  where the same loop over 11 products at once read 11.5 GB/s.
                  Measured here (2-core Intel Xeon Sapphire Rapids VM, AVX-512/AMX, torch 2.13, one
                  thread, bench-150m random weights, FastGenerator step at position 16, helpers.bench's
                  rows_quantized_compiled, interleaved medians; the machine is shared):
                    fp32 compiled 48-50 ms (595 MB read per step);
                    int8 (155.7 MB, byte ratio 3.82x): int8pack compiled 30.9 ms (1.65x), fused_dequant
                      compiled 19.0 ms (2.62x; 30 ms with one accumulator), linear_then_scale compiled
                      207 ms in an earlier run (inductor calls mm on a dequantized fp32 copy it writes
                      every step, with max_autotune too);
                    int4 (91.4 MB, byte ratio 6.51x): int4pack compiled 16.3 ms (2.92x), fused_dequant
                      compiled 32.7 ms (1.54x: unpacking nibbles and applying a scale and zero per weight
                      is the bottleneck, and splitting the rows did not change it: 31.4 ms for 1, 2 or 4
                      blocks).
                  So int8 beats torch's kernel and int4 loses to it; fused_dequant also keeps fp32
                  activations: logits within 1e-6 of the "reference" kernel (relative to the largest),
                  where the bf16-activation kernels are within 7e-3 and can flip the top token.
                  The numbers vary by CPU: inductor's loop and torch's library kernels are vectorized
                  differently per instruction set. Not measured on a GPU (there the same graph becomes
                  a Triton kernel).
    "auto"        CPU: int8 -> "int8pack", int4 -> "int4pack"; CUDA: int8 -> "linear_then_scale", int4
                  -> "int4pack"; bf16 and fp16 -> "fused_dequant" everywhere. On a shared 2-core x86
                  CPU (one thread), whole-model eager decode of a 137M-parameter model ran about 1.8x
                  (int8pack), 3x (dynamic) and 3x (int4pack) faster than fp32; "dynamic" is not the
                  default because rounding activations moved the logits ten times more than rounding
                  the weights did. With two threads on a busy machine all three were several times
                  *slower* than fp32 (their parallel loops wait for the busy core). The CUDA choices
                  follow the torch source (its CUDA _weight_int8pack_mm runs one thread per output
                  element) and were not measured here.

Scales and zeros are stored in bfloat16 (2 bytes each; the int4 kernels require it), and the integers
are computed from the stored, rounded scales, so dequantizing reproduces exactly what a kernel uses.
Packed kernel layouts are device-specific: quantize on the device you will run on.

Out of scope: activation-aware methods (GPTQ, AWQ, SmoothQuant), quantized KV caches, fp8, training.
"""
from __future__ import annotations

import copy
import functools
import logging
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

FLOAT_FORMATS = {"bf16": torch.bfloat16, "fp16": torch.float16}  # 16-bit weights, no scales (see the docstring)
METHODS = ("int8", "int4", *FLOAT_FORMATS)
KERNELS = ("auto", "reference", "int8pack", "int4pack", "dynamic", "linear_then_scale", "fused_dequant")
KERNEL_GROUP_SIZES = (32, 64, 128, 256)  # what torch's int4 kernels accept
STORAGE_DTYPE = torch.bfloat16  # scales and zeros
ROW_SPLIT = 4  # fused_dequant: output rows in this many blocks, one accumulator each (see _fused_dequant_row)
_TINY = 1e-10  # smallest scale: an all-zero row or group quantizes to zeros instead of dividing by 0


# ---------------------------------------------------------------------------------------------
# The arithmetic, by hand
# ---------------------------------------------------------------------------------------------

def _check_weight(w, name: str = "w") -> None:
    if not isinstance(w, torch.Tensor) or not w.is_floating_point():
        raise ValueError(f"{name} must be a floating-point torch.Tensor; got {getattr(w, 'dtype', type(w).__name__)}")
    if w.dim() != 2:
        raise ValueError(f"{name} must be 2-D (out_features, in_features); got shape {tuple(w.shape)}")


def _check_finite(reduced: torch.Tensor) -> None:
    """NaN and inf survive max/min reductions, so checking the (small) reduced tensor is enough."""
    if not torch.isfinite(reduced).all():
        raise ValueError("w must contain only finite values (no NaN or inf)")


def _check_bits(bits, allowed) -> None:
    if not isinstance(bits, int) or isinstance(bits, bool) or bits not in allowed:
        raise ValueError(f"bits must be an int in [{min(allowed)}, {max(allowed)}]; got {bits!r}")


def quantize_absmax(w: torch.Tensor, bits: int = 8, per_channel: bool = False,
                    scale_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric absmax quantization: scale = max|w| / (2^(bits-1) - 1), q = round(w / scale).

    per_channel=False: one scale for the whole tensor (shape ()); True: one per output row (N, 1).
    Returns int8 codes in [-(2^(bits-1) - 1), 2^(bits-1) - 1] and the scale, stored as `scale_dtype`.
    """
    _check_weight(w)
    _check_bits(bits, range(2, 9))
    qmax = 2 ** (bits - 1) - 1
    w32 = w.float()
    absmax = w32.abs().amax(dim=1, keepdim=True) if per_channel else w32.abs().amax()  # (N, 1) or ()
    _check_finite(absmax)
    scale = (absmax / qmax).clamp(min=_TINY).to(scale_dtype)  # stored, possibly rounded
    q = (w32 / scale.float()).round_().clamp_(-qmax, qmax).to(torch.int8)  # (N, K)
    return q, scale


def dequantize_absmax(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (q.float() * scale.float()).to(dtype)


def _check_group_size(group_size, K: int) -> None:
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 2:
        raise ValueError(f"group_size must be an int >= 2; got {group_size!r}")
    if K % group_size:
        raise ValueError(f"group_size ({group_size}) must divide in_features ({K}); "
                         f"allowed: divisors of {K} that are >= 2")


def quantize_groupwise(w: torch.Tensor, bits: int = 4, group_size: int = 64, symmetric: bool = False,
                       scale_dtype: torch.dtype = torch.float32):
    """Group-wise quantization along K: one scale (and zero) per `group_size` consecutive weights of a row.

    asymmetric: scale = (max - min) / (2^bits - 1), zero = min + 2^(bits-1) * scale,
                q = round((w - zero) / scale) + 2^(bits-1), clamped to [0, 2^bits - 1] (uint8);
                w ~ (q - 2^(bits-1)) * scale + zero.
    symmetric:  scale = max|w| / (2^(bits-1) - 1), q = round(w / scale) (int8), zeros is None.
    Returns q (N, K), scales (N, K // group_size), zeros (N, K // group_size) or None.
    """
    _check_weight(w)
    _check_bits(bits, range(2, 9))
    N, K = w.shape
    _check_group_size(group_size, K)
    groups = w.float().reshape(N, K // group_size, group_size)  # (N, G, g)
    if symmetric:
        qmax = 2 ** (bits - 1) - 1
        absmax = groups.abs().amax(-1)  # (N, G)
        _check_finite(absmax)
        scales = (absmax / qmax).clamp(min=_TINY).to(scale_dtype)  # (N, G)
        q = (groups / scales.float().unsqueeze(-1)).round_().clamp_(-qmax, qmax).to(torch.int8)
        return q.reshape(N, K), scales, None
    mid, top = 2 ** (bits - 1), 2 ** bits - 1
    lo, hi = torch.aminmax(groups, dim=-1)  # (N, G) each
    _check_finite(hi - lo)
    scales = ((hi - lo) / top).clamp(min=_TINY).to(scale_dtype)  # (N, G)
    zeros = (lo + mid * scales.float()).to(scale_dtype)  # (N, G): the value of code `mid`
    q = (groups - zeros.float().unsqueeze(-1)).div_(scales.float().unsqueeze(-1)).round_().add_(mid)
    return q.clamp_(0, top).to(torch.uint8).reshape(N, K), scales, zeros


def dequantize_groupwise(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, group_size: int,
                         bits: int = 4, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    N, K = q.shape
    _check_group_size(group_size, K)
    codes = q.float().reshape(N, K // group_size, group_size)  # (N, G, g)
    if zeros is None:
        w = codes * scales.float().unsqueeze(-1)
    else:
        w = (codes - 2 ** (bits - 1)) * scales.float().unsqueeze(-1) + zeros.float().unsqueeze(-1)
    return w.reshape(N, K).to(dtype)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes (0..15) per byte: (N, K) uint8 -> (N, K/2) uint8, even k in the low nibble."""
    if q.dtype != torch.uint8 or q.dim() != 2 or q.shape[1] % 2:
        raise ValueError(f"q must be a 2-D uint8 tensor with an even number of columns; got {q.dtype} "
                         f"{tuple(q.shape)}")
    if int(q.max()) > 15:
        raise ValueError(f"q must hold 4-bit codes in [0, 15]; got max {int(q.max())}")
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_int4: (N, K/2) uint8 -> (N, K) uint8 codes."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1)  # (N, K)


class _KnownFallback(logging.Filter):
    """Drops inductor's warning that aten.detach_copy (see _materialize) has no C shim: with the C++ wrapper
    it is called through the proxy executor instead, as intended, and a cold compile would otherwise print
    the warning once per quantized layer."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "aten.detach_copy" not in record.getMessage()


logging.getLogger("torch._inductor.ir").addFilter(_KnownFallback())


def _materialize(x: torch.Tensor) -> torch.Tensor:
    """A copy that inductor does not see into. Without it, inductor inlines the computation of a layer's
    input (embedding lookup, RMSNorm, residual add, SiLU) into the fused_dequant loop, and so recomputes
    it once per *output* row: the whole-model int8 step then ran 1.4x slower than torch's int8 kernel.
    aten.detach_copy has no inductor lowering (torch 2.13), so it runs as a call into ATen from the
    generated code (a few microseconds); a Python custom op did the same at ~85 us a call."""
    return torch.ops.aten.detach_copy(x)


def pack_int4_halves(q: torch.Tensor, group_size: int) -> torch.Tensor:
    """The "fused_dequant" layout: (N, K) uint8 codes (0..15) -> (N, G, g/2) uint8, where byte j of a group
    holds code j in its low nibble and code j + g/2 in its high nibble. Unpacking is then `& 15` and
    `>> 4` with no interleave, which a compiled loop does in registers."""
    if q.dtype != torch.uint8 or q.dim() != 2:
        raise ValueError(f"q must be a 2-D uint8 tensor; got {q.dtype} {tuple(q.shape)}")
    N, K = q.shape
    _check_group_size(group_size, K)
    if group_size % 2:
        raise ValueError(f"group_size must be even to pack two codes per byte; got {group_size}")
    if int(q.max()) > 15:
        raise ValueError(f"q must hold 4-bit codes in [0, 15]; got max {int(q.max())}")
    halves = q.reshape(N, K // group_size, 2, group_size // 2)  # (N, G, 2, g/2)
    return (halves[:, :, 0] | (halves[:, :, 1] << 4)).contiguous()


def unpack_int4_halves(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_int4_halves: (N, G, g/2) uint8 -> (N, K) uint8 codes."""
    N = packed.shape[0]
    return torch.stack([packed & 0x0F, packed >> 4], dim=2).reshape(N, -1)  # (N, G, 2, g/2) -> (N, K)


# ---------------------------------------------------------------------------------------------
# A drop-in nn.Linear on real kernels
# ---------------------------------------------------------------------------------------------

def available_kernels(method: str, device) -> list[str]:
    """Kernels QuantizedLinear can use for `method` on `device` (besides "auto")."""
    device = torch.device(device)
    out = ["reference"]
    if method in FLOAT_FORMATS:  # no library kernel multiplies 16-bit weights by float32 activations
        return out + ["fused_dequant"]
    if method == "int8":
        out.append("int8pack")
        if device.type == "cpu" and set(torch.backends.quantized.supported_engines) & {"fbgemm", "x86"}:
            out.append("dynamic")
        out.append("linear_then_scale")
    elif method == "int4" and device.type in ("cpu", "cuda"):
        if device.type == "cpu" or torch.cuda.get_device_capability(device)[0] >= 8:
            out.append("int4pack")
    out.append("fused_dequant")  # plain tensor ops: any device
    return out


def resolve_kernel(method: str, kernel: str, device) -> str:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}; got {kernel!r}")
    device = torch.device(device)
    available = available_kernels(method, device)
    if kernel == "auto":
        if method in FLOAT_FORMATS:
            return "fused_dequant"
        if method == "int4":
            return "int4pack" if "int4pack" in available else "reference"
        return "linear_then_scale" if device.type == "cuda" else "int8pack"
    if kernel not in available:
        raise ValueError(f"kernel {kernel!r} is not available for {method} on {device.type}; "
                         f"choose one of {available + ['auto']}")
    return kernel


def _inner_k_tiles(K: int) -> int:
    """How many 16-wide k-tiles the int4 packing puts side by side: the largest of 8, 4, 2 dividing K/16."""
    for tiles in (8, 4, 2):
        if K % (tiles * 16) == 0:
            return tiles
    raise ValueError(f"in_features ({K}) must be a multiple of 32 for the int4 kernels")


class QuantizedLinear(nn.Module):
    """y = x W^T with W stored as int8 codes (one scale per output row) or int4 codes (one scale and
    zero per group of `group_size` inputs), scales and zeros in bf16; or ("bf16", "fp16") W itself in
    that format. Output dtype = input dtype."""

    def __init__(self, weight: torch.Tensor, method: str = "int8", group_size: int = 64, kernel: str = "auto"):
        super().__init__()
        _check_weight(weight, "weight")
        self.kernel = resolve_kernel(method, kernel, weight.device)
        self.method, self.dtype, self.device_type = method, weight.dtype, weight.device.type
        self.out_features, self.in_features = N, K = weight.shape
        self.group_size = group_size if method == "int4" else None
        w = weight.detach()
        if method in FLOAT_FORMATS:
            self.weight_bits = 16
            self.register_buffer("qweight", w.to(FLOAT_FORMATS[method]))  # (N, K): the weight, rounded
            return
        if method == "int8":
            self.weight_bits = dynamic_weight_bits() if self.kernel == "dynamic" else 8
            q, scales = quantize_absmax(w, bits=self.weight_bits, per_channel=True,
                                        scale_dtype=STORAGE_DTYPE)  # (N, K), (N, 1)
            self.register_buffer("scales", scales.reshape(N))  # (N,) bf16
            if self.kernel == "dynamic":
                self._packed = prepack_dynamic(q, self.scales)  # fbgemm's own int8 layout (CPU only)
            else:
                self.register_buffer("qweight", q)  # (N, K) int8
            return
        self.weight_bits = 4
        if group_size not in KERNEL_GROUP_SIZES:
            raise ValueError(f"group_size must be one of {KERNEL_GROUP_SIZES} for int4; got {group_size!r}")
        _check_group_size(group_size, K)
        if K % 32:
            raise ValueError(f"in_features ({K}) must be a multiple of 32 for int4")
        if self.kernel == "int4pack" and self.device_type == "cuda" and N % 8:
            raise ValueError(f"out_features ({N}) must be a multiple of 8 for the CUDA int4 kernel")
        q, scales, zeros = quantize_groupwise(w, bits=4, group_size=group_size, scale_dtype=STORAGE_DTYPE)
        if self.kernel == "fused_dequant":
            self.register_buffer("qweight", pack_int4_halves(q, group_size))  # (N, G, g/2) uint8
            self.register_buffer("scales", scales)  # (N, G) bf16
            self.register_buffer("zeros", zeros)  # (N, G) bf16
        elif self.kernel == "reference":
            self.register_buffer("qweight", pack_int4(q))  # (N, K/2) uint8: two codes per byte
            self.register_buffer("scales", scales)  # (N, G) bf16
            self.register_buffer("zeros", zeros)  # (N, G) bf16
        else:
            self.register_buffer("qweight", _pack_for_int4_kernel(q, _inner_k_tiles(K)))  # opaque tiled layout
            self.register_buffer("scales_and_zeros",  # (G, N, 2) bf16: what the int4 kernels read
                                 torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous())

    @classmethod
    def from_linear(cls, linear: nn.Linear, method: str = "int8", group_size: int = 64,
                    kernel: str = "auto") -> "QuantizedLinear":
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"linear must be an nn.Linear; got {type(linear).__name__}")
        if linear.bias is not None:
            raise ValueError("linear must have no bias (bias=False); the course model's layers have none")
        return cls(linear.weight, method=method, group_size=group_size, kernel=kernel)

    def dynamic_codes(self) -> torch.Tensor:
        """The (N, K) int8 codes the "dynamic" kernel multiplies by, unpacked from fbgemm's packed layout (they
        have dynamic_weight_bits() bits: 7 where the kernel would saturate 8-bit ones)."""
        if self.kernel != "dynamic":
            raise ValueError(f"dynamic_codes is for kernel='dynamic'; this layer's kernel is {self.kernel!r}")
        return torch.ops.quantized.linear_unpack(self._packed)[0].int_repr()

    def dequantized_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The (N, K) matrix this layer multiplies by. For int4 only with kernel="reference" (the
        kernels' tiled layouts are opaque; build a reference layer from the same weight instead)."""
        dtype = dtype or self.dtype
        if self.method in FLOAT_FORMATS:
            return self.qweight.to(dtype)
        if self.method == "int8":
            if self.kernel == "dynamic":
                q = self.dynamic_codes()  # (N, K) int8
            else:
                q = self.qweight
            return dequantize_absmax(q, self.scales.unsqueeze(1), dtype)
        if self.kernel == "fused_dequant":
            codes = unpack_int4_halves(self.qweight)  # (N, K) uint8
        elif self.kernel == "reference":
            codes = unpack_int4(self.qweight)
        else:
            raise ValueError("dequantized_weight of an int4 layer needs kernel='reference' or 'fused_dequant'; "
                             f"got kernel={self.kernel!r}")
        return dequantize_groupwise(codes, self.scales, self.zeros, self.group_size, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != self.device_type:
            raise ValueError(f"input is on {x.device.type} but this layer was quantized for {self.device_type}: "
                             "packed layouts are device-specific, so quantize on the device you run on")
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input's last dimension must be in_features={self.in_features}; got {x.shape[-1]}")
        if self.kernel == "reference":  # NEW work per call: a full-precision copy of the whole weight
            return F.linear(x, self.dequantized_weight(x.dtype))
        if self.kernel == "linear_then_scale":
            return F.linear(x, self.qweight.to(x.dtype)) * self.scales.to(x.dtype)
        if self.kernel == "fused_dequant":
            if x.numel() != self.in_features:  # more than one row: materializing (M, N, K) would not pay
                return F.linear(x, self.dequantized_weight(x.dtype))
            return self._fused_dequant_row(x)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)  # (M, K)
        if self.kernel == "dynamic":
            y = torch.ops.quantized.linear_dynamic(x2.float().contiguous(), self._packed)
        elif self.kernel == "int8pack" and x2.device.type != "cpu":
            y = torch.ops.aten._weight_int8pack_mm(x2.contiguous(), self.qweight, self.scales.to(x.dtype))
        elif self.kernel == "int8pack":  # the CPU kernel is fast only with bf16 activations
            y = torch.ops.aten._weight_int8pack_mm(x2.to(torch.bfloat16).contiguous(), self.qweight, self.scales)
        elif x2.device.type == "cuda":  # int4pack (tinygemm): bf16 activations, scales and zeros
            y = torch.ops.aten._weight_int4pack_mm(x2.to(torch.bfloat16).contiguous(), self.qweight,
                                                   self.group_size, self.scales_and_zeros)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2.to(torch.bfloat16).contiguous(), self.qweight,
                                                           self.group_size, self.scales_and_zeros)
        return y.to(x.dtype).reshape(*lead, self.out_features)

    def _fused_dequant_row(self, x: torch.Tensor) -> torch.Tensor:
        """One input row, (..., K) with a single row -> (..., N), as elementwise work plus one sum over K:
        the shape inductor fuses into a single loop. Accumulates in x's dtype.

        The rows are cut into ROW_SPLIT blocks, each its own sum: inductor gives sums over the same loop
        shape one loop with an accumulator each, so the CPU runs ROW_SPLIT independent chains of
        additions at once instead of waiting on one (a single sum's loop ran at about half the speed)."""
        lead, N = x.shape[:-1], self.out_features
        if torch.compiler.is_compiling():
            x = _materialize(x)  # (..., K): computed once, not once per output row
        x = x.reshape(1, self.in_features)  # (1, K)
        R = ROW_SPLIT if N % ROW_SPLIT == 0 else 1
        n = N // R
        blocks = [self._fused_dequant_rows(x, slice(r * n, (r + 1) * n)) for r in range(R)]  # R x (n,)
        return torch.cat(blocks).reshape(*lead, N)

    def _fused_dequant_rows(self, x: torch.Tensor, rows: slice) -> torch.Tensor:
        """x (1, K) times the dequantized weight's `rows` -> (n,)."""
        if self.method in FLOAT_FORMATS:
            return (x * self.qweight[rows].to(x.dtype)).sum(-1)  # (n, K) -> (n,)
        if self.method == "int8":
            prod = x * self.qweight[rows].to(x.dtype)  # (n, K): never stored once compiled
            return prod.sum(-1) * self.scales[rows].to(x.dtype)
        G, g = self.qweight.shape[1], self.group_size
        xg = x.reshape(1, G, 2, g // 2)  # (1, G, 2, g/2): a group's first and second half
        codes = self.qweight[rows]  # (n, G, g/2)
        scale = self.scales[rows].to(x.dtype).unsqueeze(-1)  # (n, G, 1)
        zero = self.zeros[rows].to(x.dtype).unsqueeze(-1)  # (n, G, 1)
        low = ((codes & 0x0F).to(x.dtype) - 8) * scale + zero  # (n, G, g/2): w of the first halves
        high = ((codes >> 4).to(x.dtype) - 8) * scale + zero  # (n, G, g/2): w of the second halves
        return (xg[:, :, 0] * low + xg[:, :, 1] * high).sum((-2, -1))

    def nbytes(self) -> dict:
        """Bytes of the format: codes, scales and zeros (a kernel's tiled layout has the same size)."""
        N, K = self.out_features, self.in_features
        elem = torch.empty((), dtype=STORAGE_DTYPE).element_size()
        if self.method in FLOAT_FORMATS:
            return {"weights": N * K * self.qweight.element_size(), "scales": 0, "zeros": 0}
        if self.method == "int8":
            return {"weights": N * K, "scales": N * elem, "zeros": 0}
        G = K // self.group_size
        return {"weights": N * K // 2, "scales": N * G * elem, "zeros": N * G * elem}

    def extra_repr(self) -> str:
        g = f", group_size={self.group_size}" if self.group_size else ""
        bits = f", weight_bits={self.weight_bits}" if self.weight_bits == 7 else ""  # the saturation guard
        return (f"in_features={self.in_features}, out_features={self.out_features}, method={self.method}{g}, "
                f"kernel={self.kernel}{bits}")


def _pack_for_int4_kernel(q: torch.Tensor, inner_k_tiles: int) -> torch.Tensor:
    """Codes (N, K) uint8 in 0..15 -> the layout torch's int4 matmul reads on q's device."""
    if q.device.type == "cpu":
        return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), inner_k_tiles)
    # CUDA: (N, K/2) uint8 with the even k in the HIGH nibble, then the tensor-core tile layout
    pairs = ((q[:, 0::2] << 4) | q[:, 1::2]).contiguous()  # (N, K/2) uint8
    return torch.ops.aten._convert_weight_to_int4pack(pairs, inner_k_tiles)  # (N/8, K/(tiles*16), 32, tiles/2)


def prepack_dynamic(q: torch.Tensor, scales: torch.Tensor):
    """(N, K) int8 codes and (N,) per-row scales -> fbgemm's packed weight for torch.ops.quantized.linear_dynamic
    (CPU only). It packs whatever codes it is given: QuantizedLinear(kernel="dynamic") gives it codes of
    dynamic_weight_bits() bits; chapter 11 gives it 8-bit codes to show the kernel saturating."""
    N = q.shape[0]
    with warnings.catch_warnings():  # torch >= 2.10 flags quantized tensors as deprecated; the op still ships
        warnings.simplefilter("ignore")
        qw = torch._make_per_channel_quantized_tensor(q.cpu(), scales.double().cpu(),
                                                      torch.zeros(N, dtype=torch.long), 0)
        return torch.ops.quantized.linear_prepack(qw, None)


@functools.cache
def dynamic_int8_saturates() -> bool:
    """Does this CPU's fbgemm dynamic int8 kernel saturate its int16 pair sums? Asked of the kernel itself.

    Every weight code is 127 and every activation is 1.0, which fbgemm rounds to the uint8 code 255, so
    each pair of products is 2 x 255 x 127 = 64,770. A VNNI kernel (`vpdpbusd`) accumulates in int32
    and returns 64 x 127 exactly; an AVX2 kernel (`vpmaddubsw`) clips every pair at 32,767 and returns
    about half. fbgemm picks its kernel from the CPU (or FBGEMM_ENABLE_INSTRUCTIONS), not from
    ATEN_CPU_CAPABILITY, so only running it tells. False where the kernel is not available."""
    if not set(torch.backends.quantized.supported_engines) & {"fbgemm", "x86"}:
        return False
    K, N = 64, 8
    packed = prepack_dynamic(torch.full((N, K), 127, dtype=torch.int8), torch.ones(N))
    y = torch.ops.quantized.linear_dynamic(torch.ones(1, K), packed, False)  # (1, N)
    return abs(y[0, 0].item() - 127 * K) > 0.5


def dynamic_weight_bits() -> int:
    """Bits of the weight codes the "dynamic" kernel gets: 8 where the kernel is exact, 7 where its
    int16 pair sums would saturate (see dynamic_int8_saturates)."""
    return 7 if dynamic_int8_saturates() else 8


# ---------------------------------------------------------------------------------------------
# A whole model
# ---------------------------------------------------------------------------------------------

QUANTIZED_LAYERS = ("attn.wqkv", "attn.wo", "mlp.w_gate_up", "mlp.w_down")


@torch.no_grad()
def quantize_model(model, method: str = "int8", group_size: int = 64, kernel: str = "auto",
                   quantize_head: bool = False, progress: bool = False):
    """A quantized copy of a course Transformer: every block's wqkv, wo, w_gate_up and w_down become
    QuantizedLinear. The original model is not changed.

    The tied embedding/head matrix stays in full precision by default: the embedding is a lookup (one
    row per token, not worth compressing for speed), and the output head is the layer most sensitive
    to rounding. quantize_head=True gives the head its own quantized copy of that matrix (the
    embedding keeps the full-precision one), which saves bytes *read* per decode step but stores more.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    resolve_kernel(method, kernel, model.device)  # fail before copying a large model
    if method == "int4" and group_size not in KERNEL_GROUP_SIZES:
        raise ValueError(f"group_size must be one of {KERNEL_GROUP_SIZES} for int4; got {group_size!r}")
    targets = [getattr(getattr(block, part), child) for block in model.layers
               for part, child in (name.split(".") for name in QUANTIZED_LAYERS)]
    if not all(isinstance(t, nn.Linear) for t in targets):
        raise ValueError("model must be a full-precision Transformer (its layers are already quantized)")
    # copy everything except the weights about to be replaced: the memo makes deepcopy reuse them
    replaced = [t.weight for t in targets]
    qmodel = copy.deepcopy(model, memo={id(w): w for w in replaced}).eval()
    blocks = qmodel.layers
    if progress:
        from .progress import progress_bar

        blocks = progress_bar(blocks, desc=f"quantizing ({method})", unit="layer", leave=False)
    for block in blocks:
        for name in QUANTIZED_LAYERS:
            parent_name, child = name.split(".")
            parent = getattr(block, parent_name)
            setattr(parent, child, QuantizedLinear.from_linear(getattr(parent, child), method, group_size, kernel))
    if quantize_head:
        qmodel.head = QuantizedLinear(qmodel.embed.weight, method, group_size, kernel)
    qmodel.quantization = {"method": method, "group_size": group_size if method == "int4" else None,
                           "kernel": resolve_kernel(method, kernel, model.device), "quantize_head": quantize_head}
    return qmodel


def weight_bytes_breakdown(model) -> dict:
    """Bytes of everything the model stores, split into quantized codes, scales, zeros and the tensors
    kept in full precision (embedding/head, norms). A tied matrix is counted once."""
    out = {"weights": 0, "scales": 0, "zeros": 0, "full_precision": 0}
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            for k, v in module.nbytes().items():
                out[k] += v
    seen = set()
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            out["full_precision"] += p.numel() * p.element_size()
    out["total"] = sum(out.values())
    return out
