"""Exercise checks for chapter 11 (quantization). Worked solutions:
notebooks/solutions/11_quantization_solutions.ipynb."""
from __future__ import annotations

import torch

from . import FROM_NOTEBOOK, exercise

FOUR_WEIGHTS = (0.234, -0.891, 1.234, -0.567)  # the chapter's section-1 example


def check_1(answer=FROM_NOTEBOOK):
    """(bits per weight of int4 group 128, bits per weight of int8 per channel with 4096 inputs)."""
    from ...quantize import QuantizedLinear

    def bits(layer):
        return 8 * sum(layer.nbytes().values()) / (64 * 4096)

    want = (bits(QuantizedLinear(torch.zeros(64, 4096), "int4", group_size=128)),
            bits(QuantizedLinear(torch.zeros(64, 4096), "int8")))

    def is_right(a):
        int4_bits, int8_bits = a
        return abs(float(int4_bits) - want[0]) < 1e-9 and abs(float(int8_bits) - want[1]) < 1e-9

    exercise("11.1", answer, is_right, hint="count the codes, then the 16-bit scale (and zero) each group or row adds",
             name="answer_bits")


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

    exercise("11.2", answer, is_right, hint="4-bit absmax uses the integers -7..7, so step = max|w| / 7",
             name="answer_4bit")


def check_3(answer=FROM_NOTEBOOK):
    """(FLOPs per byte of an int4 group-64 prefill at T = 1, the smallest T above 5 FLOPs per byte)."""
    per_byte = lambda T: 2 * T / (4.5 / 8)  # noqa: E731

    def is_right(a):
        at_one, smallest = a
        return abs(float(at_one) - per_byte(1)) < 1e-3 and smallest == next(T for T in range(1, 100) if per_byte(T) > 5)

    exercise("11.3", answer, is_right, hint="2T FLOPs per weight over 4.5 / 8 bytes per weight",
             name="answer_intensity")
