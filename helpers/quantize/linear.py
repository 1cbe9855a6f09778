"""QuantizedLinear: a drop-in bias-free nn.Linear whose weight is stored as int8 / int4 codes or 16-bit floats,
multiplied by torch's real kernels (`kernel=`):

    "reference"   dequantize the whole weight, then F.linear (many_rows.linear: oneDNN's GEMM for 128 rows
                  and more on a CPU): the teaching version, any device. It
                  reads the small integers *and* writes and reads a full-precision copy on every call,
                  so it is slower than not quantizing at all.
    "int8pack"    int8: torch.ops.aten._weight_int8pack_mm (weight-only int8; on a CPU it is fast only
                  with bf16 activations, so the input is cast to bf16 and the output back).
    "int4pack"    int4: CPU torch.ops.aten._weight_int4pack_mm_for_cpu, CUDA _weight_int4pack_mm
                  (tinygemm); both read bf16 activations and bf16 scales/zeros. On a CPU with bf16
                  instructions oneDNN uses (many_rows.BF16_FAST), from INT4_DEQUANTIZE_MIN_ROWS rows (a
                  prefill), the layer instead reads its packed codes back, dequantizes them to bf16 once and
                  makes one bf16 GEMM (1.8-2.0x the kernel at 512 rows on an AMD Zen 5 VM, one thread).
    "dynamic"     int8, CPU: torch.ops.quantized.linear_dynamic (fbgemm/x86). Not weight-only: it also
                  rounds each call's activations to 8 bits (one scale per call), so its error is larger.
                  On CPUs without VNNI (plain AVX2, and AVX-512 without VNNI) fbgemm multiplies u8 x s8
                  with `vpmaddubsw`, which adds each *pair* of products into a saturating int16: two
                  products of 255 x 127 overflow it. There the weights get 7-bit codes (|q| <= 63),
                  so a pair sum is at most 2 x 255 x 63 = 32,130 < 32,767 and the kernel is exact again;
                  `dynamic_weight_bits()` says which applies on this machine (it asks the kernel).
                  int4, CPU: helpers/quantize/cpu_kernels.cpp, built once per machine with the system's C++
                  compiler (listed where one is found; group size 64 or a multiple of 128): the 4-bit codes
                  times the activations rounded to int8 per group, as llama.cpp's q4_0 x q8_0, with AVX512-VNNI
                  byte dot products where the CPU has them (a scalar loop elsewhere). Up to native.MAX_ROWS
                  rows (decode, a verify pass); more rows (a prefill) are multiplied unrounded by the weight
                  dequantized once, in bf16 where many_rows.BF16_FAST, else float32. "auto" never picks it:
                  rounding the activations moves the output more than the weight's 4 bits do alone.
    "cpu_rows"    int8, fp16, bf16, CPU: helpers/quantize/cpu_kernels.cpp (native.py builds it once per machine with
                  the system's C++ compiler; listed where one is found; in_features a multiple of 64, or 32 for
                  16-bit weights): weight-only, float32 activations, four output rows per pass over weights
                  interleaved by four rows, widened 16 at a time with AVX-512 (a scalar loop elsewhere), for up
                  to native.MAX_ROWS rows (more: one GEMM over the dequantized weight). For the decode step.
    "linear_then_scale"  int8: F.linear(x, q.to(x.dtype)) * scale, the form torch.compile fuses into one
                  kernel on a GPU (gpt-fast's weight-only int8). In eager mode it is not fast.
    "fused_dequant"  int8, int4, bf16 or fp16, written for torch.compile: at batch 1 (one input row) the product is
                  an elementwise dequantize-multiply followed by a sum over K, (x * dequant(q)).sum(-1),
                  which inductor generates as one C++ loop per output (load 16 codes, convert, scale,
                  multiply-add) that never writes a full-precision weight. int4 codes are stored two per
                  byte in its own layout (the first and second half of each group share a byte), so the
                  unpacking is two bit operations in that loop. Eager it is slow (the broadcast product
                  is materialized), and inputs of more than one row (prefill, batch > 1) take the
                  "reference" path (whose many-row products go through oneDNN: the bench's 149M int8 and
                  fp16 prefills, see many_rows.py). The output rows are cut into ROW_SPLIT blocks, each
                  its own sum: inductor runs sums of the same loop shape in one loop with one accumulator
                  each, and a single accumulator's chain of dependent additions held the int8 loop to
                  about 6 GB/s of codes (the fused gate/up product: 0.97 ms for 5.8 MB; the CPU waits on each add),
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
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import many_rows
from ..row_sums import realized
from . import (
    arithmetic,  # the functions by hand and the tables of formats and kernels, each named where used
    int4_dynamic,  # the int4 "dynamic" kernel's layout and reference
    native,  # the course's C++ kernels ("dynamic" for int4, "cpu_rows"), built on first use
)
from .dynamic import dynamic_weight_bits, prepack_dynamic
from .int4pack_cpu import (  # the int4 kernel's codes read back, for a prefill as one bf16 GEMM
    INT4_DEQUANTIZE_MIN_ROWS,
    INT4PACK_CPU_BLOCK,
    dequantize_int4pack_cpu,
    unpack_int4pack_cpu,
)


def available_kernels(method: str, device) -> list[str]:
    """Kernels QuantizedLinear can use for `method` on `device` (besides "auto")."""
    device = torch.device(device)
    out = ["reference"]
    if method in arithmetic.FLOAT_FORMATS:  # no library kernel multiplies 16-bit weights by float32 activations
        return out + ["fused_dequant"] + (["cpu_rows"] if device.type == "cpu" and native.buildable() else [])
    if method == "int8":
        out.append("int8pack")
        if device.type == "cpu" and set(torch.backends.quantized.supported_engines) & {"fbgemm", "x86"}:
            out.append("dynamic")
        out.append("linear_then_scale")
        if device.type == "cpu" and native.buildable():
            out.append("cpu_rows")  # built when a layer first asks for it
    elif method == "int4" and device.type in ("cpu", "cuda"):
        if device.type == "cpu" or torch.cuda.get_device_capability(device)[0] >= 8:
            out.append("int4pack")
        if device.type == "cpu" and native.buildable():
            out.append("dynamic")  # built when a layer first asks for it
    out.append("fused_dequant")  # plain tensor ops: any device
    return out


def resolve_kernel(method: str, kernel: str, device) -> str:
    if method not in arithmetic.METHODS:
        raise ValueError(f"method must be one of {arithmetic.METHODS}; got {method!r}")
    if kernel not in arithmetic.KERNELS:
        raise ValueError(f"kernel must be one of {arithmetic.KERNELS}; got {kernel!r}")
    device = torch.device(device)
    available = available_kernels(method, device)
    if kernel == "auto":
        if method in arithmetic.FLOAT_FORMATS:
            return "fused_dequant"
        if method == "int4":
            return "int4pack" if "int4pack" in available else "reference"
        return "linear_then_scale" if device.type == "cuda" else "int8pack"
    if kernel not in available:
        raise ValueError(
            f"kernel {kernel!r} is not available for {method} on {device.type}; choose one of {available + ['auto']}"
        )
    return kernel


def inner_k_tiles(K: int) -> int:
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
        arithmetic.check_weight(weight, "weight")
        self.kernel = resolve_kernel(method, kernel, weight.device)
        self.method, self.dtype, self.device_type = method, weight.dtype, weight.device.type
        self.out_features, self.in_features = N, K = weight.shape
        self.group_size = group_size if method == "int4" else None
        self._dequantizes_many_rows = False  # int4pack on a CPU may set it (see below)
        w = weight.detach()
        if method in arithmetic.FLOAT_FORMATS:
            self.weight_bits = 16
            w16 = w.to(arithmetic.FLOAT_FORMATS[method])  # (N, K): the weight, rounded
            if self.kernel == "cpu_rows":
                if K % 32:
                    raise ValueError(f"in_features ({K}) must be a multiple of 32 for the 'cpu_rows' kernel")
                self._load_native()
                self._vector, w16 = native.avx512(), native.interleave_weight(w16)  # rows interleaved by four
            self.register_buffer("qweight", w16)
            return
        if method == "int8":
            self.weight_bits = dynamic_weight_bits() if self.kernel == "dynamic" else 8
            q, scales = arithmetic.quantize_absmax(
                w, bits=self.weight_bits, per_channel=True, scale_dtype=arithmetic.STORAGE_DTYPE
            )  # (N, K), (N, 1)
            self.register_buffer("scales", scales.reshape(N))  # (N,) bf16
            if self.kernel == "dynamic":
                self._packed = prepack_dynamic(q, self.scales)  # fbgemm's own int8 layout (CPU only)
            elif self.kernel == "cpu_rows":
                if K % 64:
                    raise ValueError(f"in_features ({K}) must be a multiple of 64 for the 'cpu_rows' kernel")
                self._load_native()
                self._vector = native.avx512()  # read once: a compiled graph sees a constant
                self.register_buffer("qweight", native.interleave_rows(q).contiguous())  # (N, K) int8, interleaved
            else:
                self.register_buffer("qweight", q)  # (N, K) int8
            return
        self.weight_bits = 4
        if group_size not in arithmetic.KERNEL_GROUP_SIZES:
            raise ValueError(f"group_size must be one of {arithmetic.KERNEL_GROUP_SIZES} for int4; got {group_size!r}")
        arithmetic.check_group_size(group_size, K)
        if K % 32:
            raise ValueError(f"in_features ({K}) must be a multiple of 32 for int4")
        if self.kernel == "int4pack" and self.device_type == "cuda" and N % 8:
            raise ValueError(f"out_features ({N}) must be a multiple of 8 for the CUDA int4 kernel")
        q, scales, zeros = arithmetic.quantize_groupwise(
            w, bits=4, group_size=group_size, scale_dtype=arithmetic.STORAGE_DTYPE
        )
        if self.kernel == "dynamic":
            int4_dynamic.check_group_size(group_size)
            self._load_native()
            self._vnni = native.vnni()  # read once: a compiled graph sees a constant
            # inputs of up to this many rows are rounded (decode, a verify pass); a quality measurement of the
            # decode's own arithmetic over whole windows raises it (helpers/bench/llama_cpp.py)
            self.rounded_rows = native.MAX_ROWS
            self.register_buffer("qweight", int4_dynamic.pack(q, group_size))  # (N, G, g/2) uint8, rows interleaved
            self.register_buffer("scales", scales)  # (N, G) bf16
            self.register_buffer("zeros", zeros)  # (N, G) bf16
        elif self.kernel == "fused_dequant":
            self.register_buffer("qweight", arithmetic.pack_int4_halves(q, group_size))  # (N, G, g/2) uint8
            self.register_buffer("scales", scales)  # (N, G) bf16
            self.register_buffer("zeros", zeros)  # (N, G) bf16
        elif self.kernel == "reference":
            self.register_buffer("qweight", arithmetic.pack_int4(q))  # (N, K/2) uint8: two codes per byte
            self.register_buffer("scales", scales)  # (N, G) bf16
            self.register_buffer("zeros", zeros)  # (N, G) bf16
        else:
            self.register_buffer("qweight", pack_for_int4_kernel(q, inner_k_tiles(K)))  # opaque tiled layout
            self.register_buffer(
                "scales_and_zeros",  # (G, N, 2) bf16: what the int4 kernels read
                torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous(),
            )
            # many rows: dequantize to bf16 and multiply through oneDNN, where that is faster and the packed
            # layout is the one unpack_int4pack_cpu reads (checked on these very codes)
            self._dequantizes_many_rows = (
                self.device_type == "cpu"
                and many_rows.BF16_FAST
                and N % INT4PACK_CPU_BLOCK == 0
                and torch.equal(unpack_int4pack_cpu(self.qweight, N).t(), q)
            )

    def _load_native(self) -> None:
        why_not = native.load()
        if why_not is not None:
            raise ValueError(
                f"kernel {self.kernel!r} needs the course's C++ kernels, which cannot be loaded: {why_not}"
            )

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, method: str = "int8", group_size: int = 64, kernel: str = "auto"
    ) -> "QuantizedLinear":
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
        """The (N, K) matrix this layer multiplies by. For int4 only with kernel="reference", "fused_dequant"
        or "dynamic" (int4pack's tiled layout is opaque; build a reference layer from the same weight instead)."""
        dtype = dtype or self.dtype
        if self.method in arithmetic.FLOAT_FORMATS:
            w16 = native.deinterleave_weight(self.qweight) if self.kernel == "cpu_rows" else self.qweight
            return w16.to(dtype)
        if self.method == "int8":
            if self.kernel == "dynamic":
                q = self.dynamic_codes()  # (N, K) int8
            elif self.kernel == "cpu_rows":
                q = native.deinterleave_rows(self.qweight)  # (N, K) int8
            else:
                q = self.qweight
            return arithmetic.dequantize_absmax(q, self.scales.unsqueeze(1), dtype)
        if self.kernel == "dynamic":
            codes = arithmetic.unpack_int4_halves(native.deinterleave_rows(self.qweight))  # (N, K) uint8
        elif self.kernel == "fused_dequant":
            codes = arithmetic.unpack_int4_halves(self.qweight)  # (N, K) uint8
        elif self.kernel == "reference":
            codes = arithmetic.unpack_int4(self.qweight)
        else:
            raise ValueError(
                "dequantized_weight of an int4 layer needs kernel='reference', 'fused_dequant' or 'dynamic'; "
                f"got kernel={self.kernel!r}"
            )
        return arithmetic.dequantize_groupwise(codes, self.scales, self.zeros, self.group_size, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != self.device_type:
            raise ValueError(
                f"input is on {x.device.type} but this layer was quantized for {self.device_type}: "
                "packed layouts are device-specific, so quantize on the device you run on"
            )
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input's last dimension must be in_features={self.in_features}; got {x.shape[-1]}")
        if self.kernel == "reference":  # NEW work per call: a full-precision copy of the whole weight
            return many_rows.linear(x, self.dequantized_weight(x.dtype))
        if self.kernel == "linear_then_scale":
            return F.linear(x, self.qweight.to(x.dtype)) * self.scales.to(x.dtype)
        if self.kernel == "fused_dequant":
            if x.numel() != self.in_features:  # more than one row: materializing (M, N, K) would not pay
                return many_rows.linear(x, self.dequantized_weight(x.dtype))
            return self._fused_dequant_row(x)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)  # (M, K)
        if self.kernel == "dynamic" and self.method == "int4":
            y = int4_dynamic.forward(self, x2)
        elif self.kernel == "cpu_rows" and (torch.compiler.is_compiling() or x2.shape[0] <= native.MAX_ROWS):
            if self.method == "int8":
                y = torch.ops.course_quant.int8_rows_mm(
                    x2.float().contiguous(), self.qweight, self.scales, self._vector
                )
            else:  # fp16, bf16
                y = torch.ops.course_quant.float16_rows_mm(x2.float().contiguous(), self.qweight, self._vector)
        elif self.kernel == "cpu_rows":  # a prefill: one GEMM over the dequantized weight
            y = many_rows.linear(x2.float(), self.dequantized_weight(torch.float32))
        elif self.kernel == "dynamic":
            y = torch.ops.quantized.linear_dynamic(x2.float().contiguous(), self._packed)
        elif self.kernel == "int8pack" and x2.device.type != "cpu":
            y = torch.ops.aten._weight_int8pack_mm(x2.contiguous(), self.qweight, self.scales.to(x.dtype))
        elif self.kernel == "int8pack":  # the CPU kernel is fast only with bf16 activations
            y = torch.ops.aten._weight_int8pack_mm(x2.to(torch.bfloat16).contiguous(), self.qweight, self.scales)
        elif x2.device.type == "cuda":  # int4pack (tinygemm): bf16 activations, scales and zeros
            y = torch.ops.aten._weight_int4pack_mm(
                x2.to(torch.bfloat16).contiguous(), self.qweight, self.group_size, self.scales_and_zeros
            )
        elif (
            not torch.compiler.is_compiling()  # first: a test on the rows would guard a compiled graph
            and self._dequantizes_many_rows
            and x2.shape[0] >= INT4_DEQUANTIZE_MIN_ROWS
            and not (torch.is_grad_enabled() and x2.requires_grad)  # a backward would read a reused workspace
        ):  # many rows on a CPU with bf16 instructions: dequantize once, then one bf16 GEMM
            w_t = dequantize_int4pack_cpu(self.qweight, self.scales_and_zeros, self.group_size)  # (K, N) bf16
            y = torch.mm(x2.to(torch.bfloat16), w_t)  # (M, N)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x2.to(torch.bfloat16).contiguous(), self.qweight, self.group_size, self.scales_and_zeros
            )
        return y.to(x.dtype).reshape(*lead, self.out_features)

    def _fused_dequant_row(self, x: torch.Tensor) -> torch.Tensor:
        """One input row, (..., K) with a single row -> (..., N), as elementwise work plus one sum over K:
        the shape inductor fuses into a single loop. Accumulates in x's dtype.

        The rows are cut into ROW_SPLIT blocks, each its own sum: inductor gives sums over the same loop
        shape one loop with an accumulator each, so the CPU runs ROW_SPLIT independent chains of
        additions at once instead of waiting on one (a single sum's loop ran at about half the speed)."""
        lead, N = x.shape[:-1], self.out_features
        x = x.reshape(1, self.in_features)  # (1, K)
        if torch.compiler.is_compiling():
            x = realized(x)  # (1, K): computed once, not once per output row
        R = arithmetic.ROW_SPLIT if N % arithmetic.ROW_SPLIT == 0 else 1
        n = N // R
        blocks = [self._fused_dequant_rows(x, slice(r * n, (r + 1) * n)) for r in range(R)]  # R x (n,)
        return torch.cat(blocks).reshape(*lead, N)

    def _fused_dequant_rows(self, x: torch.Tensor, rows: slice) -> torch.Tensor:
        """x (1, K) times the dequantized weight's `rows` -> (n,)."""
        if self.method in arithmetic.FLOAT_FORMATS:
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
        elem = torch.empty((), dtype=arithmetic.STORAGE_DTYPE).element_size()
        if self.method in arithmetic.FLOAT_FORMATS:
            return {"weights": N * K * self.qweight.element_size(), "scales": 0, "zeros": 0}
        if self.method == "int8":
            return {"weights": N * K, "scales": N * elem, "zeros": 0}
        G = K // self.group_size
        return {"weights": N * K // 2, "scales": N * G * elem, "zeros": N * G * elem}

    def extra_repr(self) -> str:
        g = f", group_size={self.group_size}" if self.group_size else ""
        bits = f", weight_bits={self.weight_bits}" if self.weight_bits == 7 else ""  # the saturation guard
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, method={self.method}{g}, "
            f"kernel={self.kernel}{bits}"
        )


def pack_for_int4_kernel(q: torch.Tensor, inner_k_tiles: int) -> torch.Tensor:
    """Codes (N, K) uint8 in 0..15 -> the layout torch's int4 matmul reads on q's device."""
    if q.device.type == "cpu":
        return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), inner_k_tiles)
    # CUDA: (N, K/2) uint8 with the even k in the HIGH nibble, then the tensor-core tile layout
    pairs = ((q[:, 0::2] << 4) | q[:, 1::2]).contiguous()  # (N, K/2) uint8
    return torch.ops.aten._convert_weight_to_int4pack(pairs, inner_k_tiles)  # (N/8, K/(tiles*16), 32, tiles/2)
