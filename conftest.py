"""Shared test setup for every pytest run, `pytest notebooks/` included: the environment notebook kernels
inherit, the nbval sanitizer, the `cuda` marker and random-weight models."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

from helpers.compiling import use_course_compile_cache
from helpers.model import ModelConfig, Transformer
from helpers.paths import REPO

TESTS = REPO / "tests"
os.environ.setdefault("PYTHONHASHSEED", "0")
# one thread per process: the suite runs two workers on two cores, and small models gain nothing from
# more threads (they only fight over the cores); notebook kernels inherit this too
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)
# figures the notebooks save during the tests go to a temp folder, not over the committed ones
# (notebook kernels and the browser test's JupyterLab inherit this)
os.environ.setdefault("LLM_COURSE_FIGURES", tempfile.mkdtemp(prefix="course-figures-"))
# every figure a notebook saves is checked for overlapping or escaping labels (course/figure_check.py)
os.environ.setdefault("LLM_COURSE_CHECK_FIGURES", "1")
# torch.compile's cache: TORCHINDUCTOR_CACHE_DIR, unless set, points at .cache/inductor/<instruction set> instead
# of the system temp folder (inductor_cache_dir says why per set), here and in the notebook kernels
use_course_compile_cache()


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (skipped on machines without one)")
    config.addinivalue_line("markers", "browser: drives JupyterLab in headless Chromium")
    # nbval reads --nbval-sanitize-with relative to the working directory; give it an absolute path
    if config.getoption("nbval", default=False) or config.getoption("nbval_lax", default=False):
        if not config.getoption("nbval_sanitize_with", default=None):
            config.option.nbval_sanitize_with = str(TESTS / "nbval_sanitize.cfg")


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip)


class LogitRecorder:
    """A logits processor that keeps every row it sees (and changes nothing): the serving tests compare
    them bit for bit."""

    def __init__(self):
        self.rows = []

    def __call__(self, ids, logits):
        self.rows.append(logits[0].clone())
        return logits


def random_model(cfg: ModelConfig, seed: int = 0, std: float = 0.1, dtype=torch.float32) -> Transformer:
    """A model with larger-than-init random weights, so its next-token distributions are peaked
    (at the default init all logits are nearly equal and argmax comparisons would test noise)."""
    torch.manual_seed(seed)
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, std)
            else:
                p.uniform_(0.5, 1.5)  # norm weights
    return model.to(dtype).eval()


@pytest.fixture(scope="session")
def shipped():
    """The shipped target and draft models with their tokenizer (CPU, float32)."""
    from helpers import load_model

    target, tok = load_model("target", device="cpu", dtype=torch.float32)
    draft, _ = load_model("draft", device="cpu", dtype=torch.float32)
    return target, draft, tok


@pytest.fixture
def compile_fails(monkeypatch):
    """torch.compile "succeeds" but every compiled call raises, as on a machine whose compiler breaks:
    for the tests of the eager fallback (FastGenerator, compiled speculative decoding)."""
    from helpers import fast_decode

    def broken_compile(fn, **kwargs):
        def fail(*args):
            raise RuntimeError("no compiler here")

        return fail

    monkeypatch.setattr(fast_decode, "compile_available", lambda: True)
    monkeypatch.setattr(torch, "compile", broken_compile)
