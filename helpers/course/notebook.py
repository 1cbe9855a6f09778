"""The first cell of every notebook: seeds, print options, plot style, device.

    from helpers.course.notebook import setup
    device = setup()

Seeds Python's `random`, NumPy and torch (the same numbers every run), runs torch on one CPU thread
by default, and prints the device only when it is not the CPU, so stored outputs do not depend on
where they were made.

Why one thread: the course's models are small, so a decode step is mostly per-operation overhead
that more threads cannot split; one thread decodes as fast as two, and when several processes share
the cores (the test suite runs two notebooks at once) extra threads fight over them and everything
slows down many times over. Pass `threads=` to use more for the few cells that train.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from ..device import default_device
from .plotting import use_course_style


def seed_everything(seed: int = 0) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def setup(seed: int = 0, threads: int = 1) -> torch.device:
    seed_everything(seed)
    torch.set_num_threads(max(1, min(threads, torch.get_num_threads())))
    torch.set_printoptions(precision=4, sci_mode=False, linewidth=110)
    np.set_printoptions(precision=4, suppress=True, linewidth=110)
    use_course_style()
    device = default_device()
    if device.type != "cpu":
        print(f"running on {device}")
    return device
