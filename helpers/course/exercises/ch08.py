"""Chapter 08's exercise checks (attention at scale). Worked solutions: notebooks/solutions/08_*."""
from __future__ import annotations

import math

import torch

from ...measure.flops import kv_cache_bytes
from ...model import ModelConfig
from . import FROM_NOTEBOOK, exercise

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
    exercise("08.1", merged_stats, right, hint="rescale each part's sum by exp(its max - the overall max)",
             name="merged_stats")


def check_2(answer=FROM_NOTEBOOK):
    """Tiles computed by causal attention over 2,048 positions in 128 x 128 tiles, and the FLOP fraction."""
    n = 2048 // 128

    def right(a):
        tiles, fraction = a
        assert int(tiles) == tiles, "causal_tiles is a whole number of tiles"
        return int(tiles) == n * (n + 1) // 2 and math.isclose(float(fraction), n * (n + 1) / 2 / n**2, rel_tol=1e-9)
    exercise("08.2", answer, right, hint="a triangle of tiles, diagonal included",
             name=("causal_tiles", "flop_fraction"))


def check_3(answer=FROM_NOTEBOOK):
    """Llama-3-8B int8 KV bytes per token (bf16 scale per token and KV head) and tokens in 16 GiB."""
    per_token = 2 * _LLAMA.n_layers * _LLAMA.n_kv_heads * (_LLAMA.head_dim * 1 + 2)

    def right(a):
        nbytes, tokens = a
        assert nbytes != kv_cache_bytes(_LLAMA, 1, dtype=torch.bfloat16), "that is the bf16 cache; codes are 1 byte"
        return nbytes == per_token and tokens == 16 * 2**30 // per_token
    exercise("08.3", answer, right, hint="K and V, every layer and KV head: head_dim codes plus one scale",
             name=("int8_bytes_per_token", "tokens_in_16_gib"))


def check_4(chunk=FROM_NOTEBOOK):
    """Largest power-of-two chunk giving >= 4 blocks per SM of a 132-SM GPU for 32 heads and 32,768 tokens."""
    def right(c):
        blocks = lambda size: _LLAMA.n_heads * math.ceil(32768 / size)
        assert isinstance(c, int) and c > 0 and c & (c - 1) == 0, "chunk is a power of two (a token count)"
        return blocks(c) >= 4 * 132 and blocks(2 * c) < 4 * 132
    exercise("08.4", chunk, right, hint="blocks = heads x number of chunks", name="chunk")
