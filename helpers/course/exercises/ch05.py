"""Checks for chapter 05's exercises (the KV cache). Worked solutions:
notebooks/solutions/05_kv_cache_solutions.ipynb. Each check prints one line (a prediction also says what was
measured) and returns nothing."""

from __future__ import annotations

import torch

from ...measure.flops import kv_cache_bytes, parameter_count
from ...model import ModelConfig
from . import FROM_NOTEBOOK, exercise, prediction

QWEN25_7B = ModelConfig(
    vocab_size=152064, max_seq_len=32768, n_layers=28, d_model=3584, n_heads=28, n_kv_heads=4, d_ff=18944
)  # head_dim 3584 / 28 = 128

# two prompts of different lengths whose greedy continuations have no near-tie (checked: the top two logits
# of every step differ by more than 0.2), so that a batched run and a single one agree on every machine
PAIR = ("class Point:", "    def __init__(self, name, value):\n        self.name")
PAIR_NEW = 12


def check_1(answer=FROM_NOTEBOOK) -> None:
    """(qwen_per_token, qwen_gib): Qwen2.5-7B's bf16 cache per token, and for 32,768 tokens in GiB."""

    def right(a):
        per_token, gib = a
        return (
            int(per_token) == kv_cache_bytes(QWEN25_7B, 1, dtype=torch.bfloat16)
            and abs(float(gib) - kv_cache_bytes(QWEN25_7B, 32768, dtype=torch.bfloat16) / 2**30) < 1e-9
        )

    exercise(
        "05.1",
        answer,
        right,
        hint="two numbers: 2 (K and V) x layers x kv_heads x head_dim x bytes, then x tokens / 2**30",
        name="qwen",
    )


def check_2(answer=FROM_NOTEBOOK) -> None:
    """(max_batch, max_batch_mha): full-context Llama-3-8B sequences that fit next to its bf16 weights in 80 GB."""
    llama = ModelConfig.from_preset("llama3-8b")
    free = 80e9 - parameter_count(llama, tied_embeddings=False) * 2
    mha = ModelConfig.from_preset("llama3-8b", n_kv_heads=32)

    def right(a):
        gqa_batch, mha_batch = a
        return int(gqa_batch) == int(free // kv_cache_bytes(llama, 8192, dtype=torch.bfloat16)) and int(
            mha_batch
        ) == int(free // kv_cache_bytes(mha, 8192, dtype=torch.bfloat16))

    exercise(
        "05.2",
        answer,
        right,
        hint="two whole numbers: the memory left after the weights, divided by one full-context sequence's cache",
        name="batches",
    )


def check_3(model, tok, answer=FROM_NOTEBOOK) -> None:
    """generate_pair(prompts, n_new): two prompts of different lengths decoded as one batch of 2, each row equal to
    generate() on its prompt alone."""
    from ...generate import generate

    prompts = [tok.encode(text, bos=True) for text in PAIR]

    def right(fn):
        got = fn([list(p) for p in prompts], PAIR_NEW)
        assert len(got) == 2 and all(len(row) == PAIR_NEW for row in got), (
            f"two lists of {PAIR_NEW} token ids, one per prompt"
        )
        for i, (p, row) in enumerate(zip(prompts, got)):
            want = generate(model, p, PAIR_NEW)[0, len(p) :].tolist()
            assert [int(t) for t in row] == want, (
                f"row {i} ({'shorter' if len(p) < max(map(len, prompts)) else 'longer'} prompt) differs from "
                f"generate() from token {next(k for k, (a, b) in enumerate(zip(row, want)) if int(a) != b)} on"
            )
        return True

    exercise(
        "05.3",
        answer,
        right,
        hint="a padding key must get zero weight, and a row of scores that is all "
        "masked must not turn into NaN (-inf everywhere)",
        name="generate_pair",
    )


def check_4(model, answer=FROM_NOTEBOOK) -> None:
    """A prediction checked by a measurement: uncached generation of 256 tokens over 128, after one token."""
    from ...generate import generate_without_cache
    from ...measure.timing import timed

    prompt = [0]  # any one-token prompt: the time does not depend on which

    def seconds(n):
        return timed(lambda: generate_without_cache(model, prompt, n), model.device)[0]

    def measure():
        generate_without_cache(model, prompt, 8)  # warm-up
        before, t256, after = seconds(128), seconds(256), seconds(128)  # 128 on both sides: a drift cancels
        return t256 / ((before + after) / 2)

    def notice(ratio):
        return (
            f"a ratio of {ratio:.2f} against 3.98 in FLOPs (the sum of k over 256 "
            f"steps over the sum over 128): each uncached step also pays a fixed cost that does not grow with k"
        )

    prediction(
        "05.4",
        answer,
        measure,
        within=(0.6, 1.5),
        notice=notice,
        name="predicted_ratio",
        hint="interpolate section 3's uncached step times over every step and sum them (estimated_total does that)",
    )
