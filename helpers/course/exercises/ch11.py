"""Exercise checks for chapter 11 (quantization). Worked solutions:
notebooks/solutions/11_quantization_solutions.ipynb. Exercise 4 is a prediction checked by a measurement (bits per
byte of the course model with 3-bit NormalFloat weights); a prediction within a factor of two is right."""

from __future__ import annotations

import math

import torch

from . import FROM_NOTEBOOK, exercise, prediction

FOUR_WEIGHTS = (0.234, -0.891, 1.234, -0.567)  # the chapter's section-1 example


def check_1(answer=FROM_NOTEBOOK):
    """(bits per weight of int4 group 128, bits per weight of int8 per channel with 4096 inputs)."""
    from ...quantize import QuantizedLinear

    def bits(layer):
        return 8 * sum(layer.nbytes().values()) / (64 * 4096)

    want = (
        bits(QuantizedLinear(torch.zeros(64, 4096), "int4", group_size=128)),
        bits(QuantizedLinear(torch.zeros(64, 4096), "int8")),
    )

    def is_right(a):
        int4_bits, int8_bits = a
        return abs(float(int4_bits) - want[0]) < 1e-9 and abs(float(int8_bits) - want[1]) < 1e-9

    exercise(
        "11.1",
        answer,
        is_right,
        hint="count the codes, then the 16-bit scale (and zero) each group or row adds",
        name="answer_bits",
    )


def check_2(answer=FROM_NOTEBOOK):
    """(the four 4-bit absmax integers as a list, the largest |error| after dequantizing)."""
    from ...quantize import dequantize_absmax, quantize_absmax

    w = torch.tensor([FOUR_WEIGHTS])
    q, s = quantize_absmax(w, bits=4)
    largest = (dequantize_absmax(q, s) - w).abs().max().item()

    def is_right(a):
        codes, error = a
        assert len(codes) == 4, "four integers, one per weight"
        return [int(c) for c in codes] == q[0].tolist() and abs(float(error) - largest) < 1e-6

    exercise(
        "11.2", answer, is_right, hint="4-bit absmax uses the integers -7..7, so step = max|w| / 7", name="answer_4bit"
    )


def check_3(answer=FROM_NOTEBOOK):
    """The 3-bit NormalFloat codebook: 8 sorted float32 levels from -1 to 1."""
    from ...nf4 import normal_float_codebook

    want = normal_float_codebook(3)

    def is_right(a):
        levels = torch.as_tensor(a, dtype=torch.float32).flatten()
        assert levels.numel() == 8, f"8 levels for 3 bits; got {levels.numel()}"
        assert bool((levels.diff() > 0).all()), "sort the levels, smallest first"
        assert float(levels.abs().max()) == 1.0 and bool((levels == 0).any()), "divide by the largest; keep an exact 0"
        assert (levels - want).abs().max() < 1e-5, "the levels are off: 4 quantiles above zero, 3 below, and the offset"
        return True

    exercise(
        "11.3",
        answer,
        is_right,
        name="nf3",
        hint="torch.special.ndtri(torch.linspace(offset, 0.5, 5)[:-1]) gives the 4 positive quantiles",
        notice="the gaps next to zero are about half those at the edges (NF4's are about a quarter): the same "
        "recipe, coarser levels",
    )


def held_out_scorer(tok, device="cpu"):
    """bits_per_byte(model) on the chapter's six held-out windows (section 3: 256 tokens each, spread over every
    16th validation file), as a function."""
    import math

    import numpy as np
    import torch.nn.functional as F

    from ...data import encode_documents, validation_documents
    from ...measure.evaluate import token_byte_lengths, windows

    val_ids = encode_documents(tok, validation_documents()[::16])
    full = [w for w in windows(val_ids, 256) if len(w) == 257]
    ids = torch.from_numpy(np.stack(full[:: len(full) // 6][:6]).astype(np.int64)).to(device)  # (6, 257)
    X, Y = ids[:, :-1], ids[:, 1:]  # (6, 256) each
    n_bytes = int(token_byte_lengths(tok)[Y.cpu().numpy()].sum())

    def bits_per_byte(m) -> float:
        with torch.no_grad():
            logits = m(X).float()  # (6, 256, V)
        return F.cross_entropy(logits.flatten(0, 1), Y.flatten(), reduction="sum").item() / math.log(2) / n_bytes

    return bits_per_byte


def rounded_copy(model, round_trip):
    """A copy of a course model whose four matrices per block hold round_trip(weight)'s values (fake quantization)."""
    import copy

    from ...quantize import QUANTIZED_LAYERS

    fake = copy.deepcopy(model)
    with torch.no_grad():
        for name, mod in fake.named_modules():
            if name.endswith(QUANTIZED_LAYERS):
                mod.weight.copy_(round_trip(mod.weight.float().cpu()).to(mod.weight))
    return fake


def nf3_bits_per_byte_rise(model, tok, device="cpu") -> float:
    """Bits per byte of the course model with its 24 matrices rounded to 3-bit NormalFloat (blocks of 64), minus
    the full model's, on the chapter's six held-out windows."""
    from ...nf4 import dequantize_nf4, quantize_nf4

    score = held_out_scorer(tok, device)
    fake = rounded_copy(model, lambda w: dequantize_nf4(*quantize_nf4(w, 64, bits=3), 64, bits=3))
    return score(fake) - score(model)


def check_4(model, tok, device="cpu", answer=FROM_NOTEBOOK):
    """A prediction checked by a measurement: the rise in bits per byte with 3-bit NormalFloat weights."""
    prediction(
        "11.4",
        answer,
        lambda: nf3_bits_per_byte_rise(model, tok, device),
        within=(0.5, 2),
        unit="bits/byte",
        name="predicted_nf3_rise",
        hint="between the uniform 3-bit rise and the 4-bit one; NF spends its levels where the weights are",
        notice="compare it with NF4's rise at 4 bits (section 4) and the uniform 3-bit rise (the bits sweep): "
        "better-placed levels move the bend of the sweep, they do not remove it",
    )


H100 = dict(bf16=989.4e12, fp8=1978.9e12, bandwidth=3.35e12)  # NVIDIA H100 SXM datasheet, dense


def smallest_prefill(bytes_per_weight: float, flops: float) -> int:
    """The smallest T at which 2T FLOPs per weight over its bytes exceed the ridge point flops / bandwidth."""
    ridge = flops / H100["bandwidth"]
    return math.floor(ridge * bytes_per_weight / 2) + 1


def check_5(answer=FROM_NOTEBOOK):
    """(smallest compute-bound T for int4 group-64 weight-only at the bf16 ridge, the same for FP8 at the FP8 ridge)."""
    want = (smallest_prefill(4.5 / 8, H100["bf16"]), smallest_prefill(1.0, H100["fp8"]))

    def is_right(a):
        t_int4, t_fp8 = a
        assert int(t_int4) == t_int4 and int(t_fp8) == t_fp8, "two whole numbers of tokens"
        assert int(t_int4) == want[0], "the int4 T is off: 2T FLOPs over 4.5 / 8 bytes per weight, against 989.4 / 3.35"
        assert int(t_fp8) == want[1], "the FP8 T is off: 2T FLOPs over 1 byte per weight, against 1978.9 / 3.35"
        return True

    exercise(
        "11.5",
        answer,
        is_right,
        name="answer_prefill",
        hint="ridge point = peak FLOP/s / bandwidth",
        notice="weight-only int4 turns compute-bound at a short prompt: past it only faster arithmetic helps, "
        "which FP8 (or W8A8 int8) brings and weight-only formats do not",
    )
