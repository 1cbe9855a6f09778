"""Checks for chapter 15's exercises (more than one device)."""

from __future__ import annotations

import math

import torch

from ...parallel.interconnect import LLAMA3_70B
from ...parallel.tensor_parallel import (
    allreduce_bytes_per_token_per_layer,
    ring_allreduce_bytes_sent,
    tp_kv_cache_bytes,
)
from . import FROM_NOTEBOOK, exercise, prediction


def _int(a) -> int:
    assert isinstance(a, int) and not isinstance(a, bool), f"expected an int, got {type(a).__name__}"
    return a


def check_1(answer=FROM_NOTEBOOK):
    """Bytes one GPU sends per token through all layers of Llama-3-70B, bf16, ring all-reduce at TP 8."""
    payload = allreduce_bytes_per_token_per_layer(LLAMA3_70B, torch.bfloat16) * LLAMA3_70B.n_layers
    expected = ring_allreduce_bytes_sent(payload, 8)

    def right(a):
        assert isinstance(a, (int, float)) and not isinstance(a, bool), f"expected a number, got {type(a).__name__}"
        return math.isclose(a, expected, rel_tol=1e-9)

    return exercise(
        "15.1",
        answer,
        right,
        hint="the payload is two all-reduces of d_model numbers per layer; a ring sends 2(p-1)/p of it",
        name="llama70_bytes_sent_per_token",
    )


def check_2(answer=FROM_NOTEBOOK):
    """KV cache bytes per GPU, Llama-3-70B, 8,192 tokens, bf16, tensor-parallel 16."""
    expected = tp_kv_cache_bytes(LLAMA3_70B, 8192, 16, dtype=torch.bfloat16)
    return exercise(
        "15.2",
        answer,
        lambda a: _int(a) == expected,
        hint="with 16 ranks and 8 key/value heads, each head lives on two ranks",
        name="kv_bytes_per_gpu_tp16",
    )


def check_3(answer=FROM_NOTEBOOK):
    """(latency_ms, tokens_per_s) of a 4-stage pipeline, 5 ms per stage, 0.1 ms per send."""

    def right(a):
        assert isinstance(a, tuple) and len(a) == 2, "expected a tuple (latency_ms, tokens_per_s)"
        latency, throughput = (float(v) for v in a)
        return math.isclose(latency, 4 * 5 + 3 * 0.1, rel_tol=1e-6) and math.isclose(throughput, 1000 / 5, rel_tol=1e-6)

    return exercise(
        "15.3",
        answer,
        right,
        hint="a token passes every stage and every boundary once; a full pipeline is as fast as its slowest stage",
        name="pipeline_answer",
    )


def check_4(mlp_partial=FROM_NOTEBOOK):
    """mlp_partial(x, mlp, rank, tp): rank `rank`'s partial output of the SwiGLU MLP split over `tp` ranks."""
    import torch.nn.functional as F

    from ...checkpoint import load_model

    model, _ = load_model("target", device="cpu", dtype=torch.float32)
    mlp, tp = model.layers[1].mlp, 4
    x = torch.randn(2, 3, model.cfg.d_model, generator=torch.Generator().manual_seed(15))  # (B, T, C)
    gate, up = mlp.w_gate_up.weight.split(model.cfg.d_ff)  # (F, C) each
    size = model.cfg.d_ff // tp

    def right(fn):
        assert callable(fn), "mlp_partial is a function of (x, mlp, rank, tp)"
        with torch.no_grad():
            parts = [torch.as_tensor(fn(x, mlp, r, tp)) for r in range(tp)]
            for r, part in enumerate(parts):
                assert part.shape == x.shape, f"rank {r}: expected shape {tuple(x.shape)}, got {tuple(part.shape)}"
                units = slice(r * size, (r + 1) * size)
                want = (F.silu(x @ gate[units].T) * (x @ up[units].T)) @ mlp.w_down.weight[:, units].T
                assert torch.allclose(part, want, atol=1e-5), (
                    f"rank {r}'s partial is not the output of hidden units {units.start}..{units.stop - 1} alone"
                )
            assert torch.allclose(sum(parts), mlp(x), atol=1e-4), "the partials do not add up to the MLP's output"
        return True

    return exercise(
        "15.4",
        mlp_partial,
        right,
        name="mlp_partial",
        hint="rows of gate and up, columns of down, for this rank's hidden units; silu(gate) * up between",
    )


def check_5(predicted_ms=FROM_NOTEBOOK, measure=None):
    """A prediction of one loopback all-reduce of 16 MB (float32, two ranks), in ms; `measure()` returns the measured
    median in seconds, and runs only once a prediction is given."""
    prediction(
        "15.5",
        predicted_ms,
        lambda: measure() * 1e3,
        ratio=2.5,
        unit=" ms",
        name="predicted_16mb_ms",
        hint="a large message costs its bytes / the bandwidth of the large messages, plus the fixed cost",
        notice=lambda ms: (
            "at 16 MB the fixed cost is lost in the bytes: the regime where real links differ "
            "(section 6), and the one prefill reaches"
        ),
    )
