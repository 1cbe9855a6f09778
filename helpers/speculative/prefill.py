"""The prompt's prefill for both models of a compiled speculative generation, as one compiled graph.

Without it, speculative_generate prefills the target and then the draft eagerly, each on the dynamic path
(40-odd small operations per layer, each paying Python and dispatch). Here one graph runs both models' static
path over the prompt, padded to a bucket of PREFILL_BUCKET tokens: one graph serves every prompt whose
length rounds up to that bucket. The padding writes K/V at positions past the prompt, which the first round
overwrites before any query attends to them (a query at position p attends keys 0..p only), as the static
steps' rollback already relies on. The graph returns nothing: no logits are needed, so inductor drops the
head and the last layer's MLP. A bucket is compiled only when asked for (warmup_speculative's
prompt_lengths); any other prompt is prefilled eagerly, so a generation never waits for a compile here.

Left out: chunking a prompt longer than the caches' room; sharing a bucket between pairs of generators.
"""

from __future__ import annotations

import warnings
import weakref

import torch

from ..fast_decode import FastGenerator, compile_options, warm_compiled

PREFILL_BUCKET = 16  # prompts are padded to a multiple of this many tokens: one graph per bucket


def prefill_bucket(tokens: int) -> int:
    """The padded length of a prefill of `tokens` tokens (the prompt less its last token)."""
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        raise ValueError(f"tokens must be an int >= 1; got {tokens!r}")
    return -(-tokens // PREFILL_BUCKET) * PREFILL_BUCKET


def compiled_for_pair(fn, target: FastGenerator, draft: FastGenerator):
    """fn compiled as one graph over both generators' models (a fused round, a fused prefill): frozen and
    autotuned where both generators are, else with the weights as inputs (the generators' own products);
    buffers pooled as in their own graphs. Returns (the compiled fn, whether it is frozen)."""
    freeze = target.gemm_autotune and draft.gemm_autotune
    options = compile_options(
        target.mode, cpp_wrapper=target.cpp_wrapper, freeze=freeze, gemm_autotune=freeze, pooled=True
    )
    return torch.compile(fn, **options), freeze


class FusedPrefill:
    """Both models' static path over `tokens` positions (0..tokens-1) as one compiled graph: call it with the
    prompt less its last token, (1, m) with m <= tokens; it writes both caches' K/V at 0..tokens-1."""

    def __init__(self, target: FastGenerator, draft: FastGenerator, tokens: int):
        self.target, self.draft, self.tokens = target, draft, tokens
        device = target.model.device
        self._ids = torch.zeros(1, tokens, dtype=torch.long, device=device)  # (1, tokens): prompt, then padding
        self._pos = torch.arange(tokens, device=device)  # (tokens,)
        self._fn, self.freeze = compiled_for_pair(self._prefill, target, draft)
        self.compiled = False
        self.compile_seconds = 0.0

    def _prefill(self, ids, pos):  # compiled, undecorated (see FastGenerator._static_step); under no_grad
        for fast in (self.target, self.draft):
            fast.decode_model(ids, cache=fast.cache, input_pos=pos, check=False)

    @torch.no_grad()
    def warmup(self) -> Exception | None:
        """Compile now (if not yet), leaving both caches as they were; returns the error, if any."""
        if self.compiled:
            return None
        error, seconds, _ = warm_compiled(
            self._fn, (self._ids, self._pos), [self.target.cache, self.draft.cache], self.tokens, self.freeze
        )
        self.compile_seconds += seconds
        self.compiled = error is None
        return error

    @torch.no_grad()
    def __call__(self, prompt: torch.Tensor) -> None:
        """prompt (1, m), m <= tokens: write both models' K/V for it at positions 0..m-1 (and padding after)."""
        m = prompt.shape[1]
        if not 1 <= m <= self.tokens:
            raise ValueError(f"prompt must have 1 to {self.tokens} tokens for this prefill; got {m}")
        self._ids[:, :m] = prompt  # the padding keeps whatever ids it held: any valid id will do
        self._fn(self._ids, self._pos)


# target FastGenerator -> {(draft FastGenerator's id, tokens): its compiled prefill, or None if it failed}
_PREFILLS: "weakref.WeakKeyDictionary[FastGenerator, dict]" = weakref.WeakKeyDictionary()


def fused_prefill(
    target: FastGenerator, draft: FastGenerator, prompt_len: int, compile: bool = False
) -> FusedPrefill | None:
    """The compiled prefill for a prompt of prompt_len tokens (its first prompt_len - 1 go through it), or None:
    nothing to prefill, generators not compiled, the bucket past either cache, or (compile=False) not compiled
    yet. compile=True compiles it now if needed (warmup_speculative)."""
    if prompt_len < 2 or not (target.compiled and draft.compiled):
        return None
    tokens = prefill_bucket(prompt_len - 1)
    if tokens > min(target.cache.max_seq_len, draft.cache.max_seq_len):
        return None
    prefills = _PREFILLS.setdefault(target, {})
    key = (id(draft), tokens)
    if key not in prefills:
        if not compile:
            return None
        prefill = FusedPrefill(target, draft, tokens)
        error = prefill.warmup()
        if error is not None:
            warnings.warn(
                f"torch.compile failed for the fused prefill of {tokens} tokens ({type(error).__name__}: "
                f"{str(error)[:200]}); such prompts are prefilled eagerly",
                stacklevel=2,
            )
            prefill = None
        prefills[key] = prefill
    return prefills[key]
