"""Chapter 07's exercise checks (worked solutions: notebooks/solutions/07_where_the_time_goes_solutions.ipynb).
Exercise 2 is a prediction checked by a measurement (the profiler's count of the draft model's operators, the
same on every machine); a prediction within 15% is right, and the check then says what it measured."""

from __future__ import annotations

from . import FROM_NOTEBOOK, exercise, prediction


def draft_step_calls() -> int:
    """The torch calls from Python in one eager decode step of the shipped draft model (the same on every machine)."""
    import torch

    from ...checkpoint import load_model
    from ...generate import decode_one_token, prefill
    from ...kv_cache import KVCache
    from ...measure.profiling import count_torch_calls

    draft, _ = load_model("draft", device="cpu", dtype=torch.float32)
    cache = KVCache.for_model(draft, max_seq_len=16)
    token = prefill(draft, torch.tensor([[1, 2, 3]]), cache).argmax(-1, keepdim=True)  # (1, 1)
    return sum(count_torch_calls(lambda: decode_one_token(draft, token, cache)).values())


def check_1(draft_calls_per_step=FROM_NOTEBOOK):
    """The torch calls Python makes in one eager decode step of the draft model."""

    def right(answer):
        assert isinstance(answer, int), f"a whole number of calls; got a {type(answer).__name__}"
        return answer == draft_step_calls()

    return exercise(
        "07.1",
        draft_calls_per_step,
        right,
        hint="count_torch_calls(...) returns a Counter: add up its values",
        name="draft_calls_per_step",
        notice="one layer costs the same calls as one of the target's six; the embedding, final norm "
        "and head are paid once, whatever the depth",
    )


def one_step_fn(model, device):
    """A function that runs one eager batch-1 decode step of `model` at the same position every call."""
    import torch

    from ...generate import decode_one_token, prefill
    from ...kv_cache import KVCache

    cache = KVCache.for_model(model, max_seq_len=32)
    token = prefill(model, torch.tensor([[1, 2, 3, 4, 5, 6]], device=device), cache).argmax(-1, keepdim=True)

    def step():
        decode_one_token(model, token, cache)
        cache.truncate(cache.length - 1)  # forget it again: every call is the same step

    return step


def draft_step_operators(device="cpu") -> float:
    """ATen operators per eager decode step of the draft model, as torch.profiler counts them (section 1's count)."""
    from ...checkpoint import load_model
    from ...device import default_dtype
    from ...measure.profiling import profile_step

    draft, _ = load_model("draft", device=device, dtype=default_dtype(device))
    return profile_step(one_step_fn(draft, device), steps=5).aten_ops_per_step


def check_2(device="cpu", predicted_draft_ops=FROM_NOTEBOOK):
    """A prediction checked by a measurement: the ATen operators one eager decode step of the draft model dispatches."""
    return prediction(
        "07.2",
        predicted_draft_ops,
        lambda: draft_step_operators(device),
        rel_tol=0.15,
        unit="operators",
        name="predicted_draft_ops",
        hint="each torch call from Python dispatches several ATen operators: section 1 printed both counts for the "
        "target, and exercise 1 counted the draft's calls",
        notice="the ratio of operators to Python calls is about the same in both models: the dispatcher's fan-out "
        "is a property of the code, and with it the fixed cost a step pays, whatever the weights",
    )


def check_3(ceiling_ms=FROM_NOTEBOOK):
    """The read-roof time of one bf16 decode step of the bench-150m config at position 16, at 20 GB/s."""

    def right(answer):
        import torch

        from ...measure.flops import forward_bytes
        from ...model import ModelConfig

        cfg = ModelConfig.from_preset("bench-150m")
        expected = forward_bytes(cfg, 1, n_past=16, bytes_per_weight=2, bytes_per_kv=2) / 20e9 * 1e3
        return abs(float(torch.as_tensor(answer)) - expected) <= 1e-6 * expected

    return exercise(
        "07.3",
        ceiling_ms,
        right,
        hint="bytes per step (forward_bytes) / bytes per second, in milliseconds",
        name="ceiling_ms",
        notice="a real step takes longer: the read roof is a floor, and a weight stream reaches a fraction of it",
    )


def check_4(bf16_answer=FROM_NOTEBOOK):
    """(the gap between 256.0 and the next bf16 number, the largest relative error of rounding to bf16 there)."""

    def right(answer):
        import torch

        gap, rel = (float(a) for a in answer)
        eps = torch.finfo(torch.bfloat16).eps
        true_gap = torch.tensor(256.0 + 256.0 * eps, dtype=torch.bfloat16) - torch.tensor(256.0, dtype=torch.bfloat16)
        assert abs(gap - float(true_gap)) < 1e-9, "the gap above 256.0 is off: the spacing scales with the power of two"
        assert abs(rel - eps / 2) < 1e-12, "the largest relative rounding error is off: it is half a gap, relative"
        return True

    return exercise(
        "07.4",
        bf16_answer,
        right,
        name="bf16_answer",
        hint="a tuple of two numbers; 256 = 2^8, and bf16 keeps 8 significant bits",
        notice="the gap grows with the number (256 times the gap at 1.0), the relative error does not",
    )
