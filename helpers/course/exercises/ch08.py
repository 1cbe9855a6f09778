"""Chapter 08's exercise checks (attention at scale). Worked solutions: notebooks/solutions/08_*."""

from __future__ import annotations

import math

import torch

from ...measure.flops import kv_cache_bytes
from ...model import ModelConfig
from . import FROM_NOTEBOOK, exercise, prediction

_LLAMA = ModelConfig.from_preset("llama3-8b")


def _summary(xs):
    m = max(xs)
    return m, sum(math.exp(x - m) for x in xs)


def check_1(merged_stats=FROM_NOTEBOOK):
    """The merged (m, l) of [3, 9] and [8, 10, 1]."""

    def right(answer):
        m, l = answer
        m_ref, l_ref = _summary([3.0, 9.0, 8.0, 10.0, 1.0])
        assert float(m) == m_ref, "m is the largest logit of both parts"
        return math.isclose(float(l), l_ref, rel_tol=1e-9)

    exercise(
        "08.1",
        merged_stats,
        right,
        hint="rescale each part's sum by exp(its max - the overall max)",
        name="merged_stats",
    )


def _window_tiles_reference(T: int, block: int, W: int) -> set[tuple[int, int]]:
    """Every (query block, key block) holding at least one visible pair i - W < j <= i (brute force)."""
    visible = torch.ones(T, T, dtype=torch.bool).tril() & ~torch.ones(T, T, dtype=torch.bool).tril(-W)
    n = math.ceil(T / block)
    return {
        (i, j)
        for i in range(n)
        for j in range(n)
        if visible[i * block : (i + 1) * block, j * block : (j + 1) * block].any()
    }


def check_2(window_tiles=FROM_NOTEBOOK):
    """window_tiles(T, block, W): the tiles a sliding-window causal kernel must compute."""
    cases = [(256, 32, 64), (256, 32, 256), (200, 64, 50), (96, 16, 1), (100, 32, 33)]

    def right(fn):
        assert callable(fn), "window_tiles is a function of (T, block, W)"
        for T, block, W in cases:
            got = {tuple(int(x) for x in pair) for pair in fn(T, block, W)}
            want = _window_tiles_reference(T, block, W)
            assert got == want, (
                f"window_tiles({T}, {block}, {W}) gives {len(got)} tiles, {len(want)} are needed"
                + (" (some you list hold no visible key)" if got - want else "")
                + (" (some you leave out hold visible keys)" if want - got else "")
            )
        return True

    def notice(_answer):
        n_window, n_causal = (len(_window_tiles_reference(4096, 128, W)) for W in (512, 4096))
        return (
            f"at T = 4,096 with 128 x 128 tiles, a 512-token window computes {n_window} tiles against "
            f"{n_causal} causal: the work grows with T x W, not T^2"
        )

    exercise(
        "08.2",
        window_tiles,
        right,
        name="window_tiles",
        notice=notice,
        hint="compare key block j's positions with the keys block i's queries can see, from its "
        "first query - W + 1 to its last query",
    )


def check_3(predicted_kib=FROM_NOTEBOOK, measure=None):
    """A prediction of tiled_attention's peak live bytes (T = 1,024, D = 64, 64 x 64 tiles); `measure()` returns
    the measured peak in bytes, and runs only once a prediction is given."""
    prediction(
        "08.3",
        predicted_kib,
        lambda: measure() / 1024,
        ratio=1.25,
        unit=" KiB",
        name="predicted_tiled_peak_kib",
        hint="the output (T x D floats), three 64 x 64 tiles and the accumulator",
        notice=lambda kib: (
            f"the output alone is {1024 * 64 * 4 / 1024:,.0f} KiB, so once T is large, "
            "smaller tiles barely lower the peak"
        ),
    )


def check_4(answer=FROM_NOTEBOOK):
    """Llama-3-8B int8 KV bytes per token (bf16 scale per token and KV head) and tokens in 16 GiB."""
    per_token = 2 * _LLAMA.n_layers * _LLAMA.n_kv_heads * (_LLAMA.head_dim * 1 + 2)

    def right(a):
        nbytes, tokens = a
        assert nbytes != kv_cache_bytes(_LLAMA, 1, dtype=torch.bfloat16), "that is the bf16 cache; codes are 1 byte"
        return nbytes == per_token and tokens == 16 * 2**30 // per_token

    exercise(
        "08.4",
        answer,
        right,
        hint="K and V, every layer and KV head: head_dim codes plus one scale",
        name=("int8_bytes_per_token", "tokens_in_16_gib"),
    )


def check_5(chunk=FROM_NOTEBOOK):
    """Largest power-of-two chunk giving >= 4 blocks per SM of a 132-SM GPU for 32 heads and 32,768 tokens."""

    def right(c):
        blocks = lambda size: _LLAMA.n_heads * math.ceil(32768 / size)
        assert isinstance(c, int) and c > 0 and c & (c - 1) == 0, "chunk is a power of two (a token count)"
        return blocks(c) >= 4 * 132 and blocks(2 * c) < 4 * 132

    exercise("08.5", chunk, right, hint="blocks = heads x number of chunks", name="chunk")
