"""The first cell of every notebook: seeds, print options, plot style, device.

    from helpers.notebook import setup
    device = setup()

Seeds Python's `random`, NumPy and torch (the same numbers every run), limits torch to the machine's
physical cores but at most 2 threads (small models decode fastest that way and timings are steadier
on shared machines), and prints the device only when it is not the CPU, so stored outputs do not
depend on where they were made.
"""
from __future__ import annotations

import random

import numpy as np
import torch

from .device import default_device
from .plotting import use_course_style


def seed_everything(seed: int = 0) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def setup(seed: int = 0, threads: int = 2) -> torch.device:
    seed_everything(seed)
    torch.set_num_threads(max(1, min(threads, torch.get_num_threads())))
    torch.set_printoptions(precision=4, sci_mode=False, linewidth=110)
    np.set_printoptions(precision=4, suppress=True, linewidth=110)
    use_course_style()
    device = default_device()
    if device.type != "cpu":
        print(f"running on {device}")
    return device
