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
activations, and its all-bf16 kernels were slower than float32 (helpers.bench's precision rows), so the
speed comes from the compiled loop. The kernels QuantizedLinear can run, and what each costs, are in
helpers.quantize.linear's docstring.

Scales and zeros are stored in bfloat16 (2 bytes each; the int4 kernels require it), and the integers
are computed from the stored, rounded scales, so dequantizing reproduces exactly what a kernel uses.
Packed kernel layouts are device-specific: quantize on the device you will run on.

Out of scope: activation-aware methods (GPTQ, AWQ, SmoothQuant), quantized KV caches, fp8, training.

Modules: arithmetic.py (the functions by hand, int4 packing), linear.py (QuantizedLinear and its kernels),
dynamic.py (fbgemm's dynamic int8 kernel and its saturation); here, a whole model. Every public name is
importable from helpers.quantize.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

from .arithmetic import (
    FLOAT_FORMATS,
    KERNEL_GROUP_SIZES,
    KERNELS,
    METHODS,
    ROW_SPLIT,
    STORAGE_DTYPE,
    dequantize_absmax,
    dequantize_groupwise,
    pack_int4,
    pack_int4_halves,
    quantize_absmax,
    quantize_groupwise,
    unpack_int4,
    unpack_int4_halves,
)
from .dynamic import dynamic_int8_saturates, dynamic_weight_bits, prepack_dynamic
from .linear import QuantizedLinear, available_kernels, resolve_kernel

__all__ = [
    "FLOAT_FORMATS",
    "KERNELS",
    "KERNEL_GROUP_SIZES",
    "METHODS",
    "QUANTIZED_LAYERS",
    "ROW_SPLIT",
    "STORAGE_DTYPE",
    "QuantizedLinear",
    "available_kernels",
    "dequantize_absmax",
    "dequantize_groupwise",
    "dynamic_int8_saturates",
    "dynamic_weight_bits",
    "pack_int4",
    "pack_int4_halves",
    "prepack_dynamic",
    "quantize_absmax",
    "quantize_groupwise",
    "quantize_model",
    "resolve_kernel",
    "unpack_int4",
    "unpack_int4_halves",
    "weight_bytes_breakdown",
]

QUANTIZED_LAYERS = ("attn.wqkv", "attn.wo", "mlp.w_gate_up", "mlp.w_down")


@torch.no_grad()
def quantize_model(
    model,
    method: str = "int8",
    group_size: int = 64,
    kernel: str = "auto",
    quantize_head: bool = False,
    progress: bool = False,
    head_method: str | None = None,
    head_kernel: str = "auto",
):
    """A quantized copy of a course Transformer: every block's wqkv, wo, w_gate_up and w_down become
    QuantizedLinear. The original model is not changed.

    The tied embedding/head matrix stays in full precision by default: the embedding is a lookup (one
    row per token, not worth compressing for speed), and the output head is the layer most sensitive
    to rounding. quantize_head=True gives the head its own quantized copy of that matrix (the
    embedding keeps the full-precision one), which saves bytes *read* per decode step but stores more.
    head_method (with head_kernel) gives the head a format of its own, and implies quantize_head: llama.cpp's
    quantized files do the same (a q4_0 file keeps the tied matrix at Q6_K, 6.6 bits a weight; a q8_0 file at
    Q8_0), which the bench's rows against llama.cpp mirror.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    resolve_kernel(method, kernel, model.device)  # fail before copying a large model
    if head_method is not None:
        if head_method not in METHODS:
            raise ValueError(f"head_method must be one of {METHODS} or None; got {head_method!r}")
        resolve_kernel(head_method, head_kernel, model.device)
        quantize_head = True
    else:
        head_method, head_kernel = method, kernel
    if method == "int4" and group_size not in KERNEL_GROUP_SIZES:
        raise ValueError(f"group_size must be one of {KERNEL_GROUP_SIZES} for int4; got {group_size!r}")
    targets = [
        getattr(getattr(block, part), child)
        for block in model.layers
        for part, child in (name.split(".") for name in QUANTIZED_LAYERS)
    ]
    if not all(isinstance(t, nn.Linear) for t in targets):
        raise ValueError("model must be a full-precision Transformer (its layers are already quantized)")
    # copy everything except the weights about to be replaced: the memo makes deepcopy reuse them
    replaced = [t.weight for t in targets]
    qmodel = copy.deepcopy(model, memo={id(w): w for w in replaced}).eval()
    blocks = qmodel.layers
    if progress:
        from ..progress import progress_bar

        blocks = progress_bar(blocks, desc=f"quantizing ({method})", unit="layer", leave=False)
    for block in blocks:
        for name in QUANTIZED_LAYERS:
            parent_name, child = name.split(".")
            parent = getattr(block, parent_name)
            setattr(parent, child, QuantizedLinear.from_linear(getattr(parent, child), method, group_size, kernel))
    if quantize_head:
        qmodel.head = QuantizedLinear(qmodel.embed.weight, head_method, group_size, head_kernel)
    qmodel.quantization = {
        "method": method,
        "group_size": group_size if method == "int4" else None,
        "kernel": resolve_kernel(method, kernel, model.device),
        "quantize_head": quantize_head,
        "head": (head_method, resolve_kernel(head_method, head_kernel, model.device)) if quantize_head else None,
    }
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
