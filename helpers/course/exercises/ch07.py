"""Chapter 07's exercise checks (worked solutions: notebooks/solutions/07_where_the_time_goes_solutions.ipynb)."""
from __future__ import annotations

from . import FROM_NOTEBOOK, exercise


def check_1(draft_calls_per_step=FROM_NOTEBOOK):
    """The torch calls Python makes in one eager decode step of the draft model."""
    def right(answer):
        import torch

        from ...checkpoint import load_model
        from ...generate import decode_one_token, prefill
        from ...kv_cache import KVCache
        from ...measure.profiling import count_torch_calls

        draft, _ = load_model("draft", device="cpu", dtype=torch.float32)
        cache = KVCache.for_model(draft, max_seq_len=16)
        token = prefill(draft, torch.tensor([[1, 2, 3]]), cache).argmax(-1, keepdim=True)  # (1, 1)
        return answer == sum(count_torch_calls(lambda: decode_one_token(draft, token, cache)).values())

    return exercise("07.1", draft_calls_per_step, right,
                    hint="count_torch_calls(...) returns a Counter: add up its values", name="draft_calls_per_step")


def check_2(ceiling_ms=FROM_NOTEBOOK):
    """The bandwidth ceiling of one bf16 decode step of the bench-150m config at position 16, at 20 GB/s."""
    def right(answer):
        import torch

        from ...measure.flops import forward_bytes
        from ...model import ModelConfig

        cfg = ModelConfig.from_preset("bench-150m")
        expected = forward_bytes(cfg, 1, n_past=16, bytes_per_weight=2, bytes_per_kv=2) / 20e9 * 1e3
        return abs(float(torch.as_tensor(answer)) - expected) <= 1e-6 * expected

    return exercise("07.2", ceiling_ms, right, hint="bytes per step / bytes per second, in milliseconds",
                    name="ceiling_ms")


def check_3(three_floats=FROM_NOTEBOOK):
    """Three float32 numbers whose sum depends on the order of the additions."""
    def right(answer):
        import numpy as np

        a, b, c = (np.float32(x) for x in answer)
        assert all(np.isfinite(x) for x in (a, b, c)), "use finite numbers"
        return (a + b) + c != a + (b + c)

    return exercise("07.3", three_floats, right, hint="a tuple (a, b, c) of three numbers", name="three_floats")
