"""Autoregressive generation in named phases: prefill, decode one token, generate.

    prefill(model, prompt, cache)          the whole prompt in one pass; fills the cache; logits of the last position
    decode_one_token(model, token, cache)  one new token against the cache; writes one slot
    generate(model, prompt, n, ...)        prefill once, then decode n-1 times, picking each token with sampling.py
    generate_without_cache(...)            the naive loop: re-run the whole sequence every step (for comparison)
    generate_sliding_window(...)           generate() on a rolling cache of the last `window` positions (chapter 05)

Both loops give identical tokens (the tests check it); the cached one does O(1) new work per step
instead of reprocessing the whole prefix.

Stop conditions: `max_new_tokens`, an end-of-text id (`eos_id`), stop sequences (lists of ids), and
`stop_criteria`: callables `criterion(generated_ids) -> bool` such as stopping.py's loop detector and
text-level stop strings. Generation past the context window raises a ValueError; it never silently
truncates (generate_sliding_window is the explicit alternative).

Out of scope: batching requests of different lengths (continuous batching), beam search.
"""

from __future__ import annotations

import torch

from .kv_cache import KVCache
from .model import check_cache, check_token_ids
from .options import keyword_options
from .sampling import SamplingConfig, check_generator, next_token
from .sliding_window import RollingKVCache
from .stopping import stop_checker


def as_prompt_tensor(prompt, model) -> torch.Tensor:
    """Accept a list of ids, a 1-D or a 2-D tensor; return (B, T) long on the model's device."""
    if isinstance(prompt, (list, tuple)):
        if len(prompt) == 0:
            raise ValueError("prompt must contain at least 1 token; got an empty prompt")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise ValueError("prompt must be a list of int token ids (encode text with the tokenizer first)")
        try:
            prompt = torch.tensor([list(prompt)], dtype=torch.long)
        except (OverflowError, RuntimeError, ValueError):  # an id beyond int64 ("Overflow when unpacking")
            raise ValueError("prompt: token ids must be in [0, vocab_size - 1]; got one beyond int64") from None
    if not isinstance(prompt, torch.Tensor):
        raise ValueError(f"prompt must be a list of token ids or a tensor; got {type(prompt).__name__}")
    if prompt.dim() == 1:
        prompt = prompt.unsqueeze(0)
    if prompt.dim() == 2 and prompt.shape[1] == 0:
        raise ValueError("prompt must contain at least 1 token; got an empty prompt")
    check_token_ids(prompt, model.cfg.vocab_size, name="prompt")
    return prompt.to(model.device, torch.long)


def check_generation_length(
    prompt_len: int, max_new_tokens, max_seq_len: int, window: str = "the context window", name: str = "max_new_tokens"
) -> None:
    """window: whose context window max_seq_len is, for the message (speculative.py checks the draft's too);
    name: the caller's name for max_new_tokens (the serving engine's is max_tokens)."""
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"{name} must be an int >= 0; got {max_new_tokens!r}")
    if prompt_len > max_seq_len:
        raise ValueError(
            f"prompt has {prompt_len} tokens but {window} (max_seq_len) is "
            f"{max_seq_len}: allowed prompt length is 1..{max_seq_len}"
        )
    if prompt_len + max_new_tokens > max_seq_len:
        raise ValueError(
            f"prompt ({prompt_len} tokens) + {name} ({max_new_tokens}) exceeds {window} "
            f"max_seq_len={max_seq_len}: allowed {name} is 0..{max_seq_len - prompt_len}"
        )


@torch.no_grad()
def prefill(model, prompt: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Run the prompt (B, T) through the model, filling cache positions 0..T-1. Returns (B, V) logits."""
    check_token_ids(prompt, model.cfg.vocab_size, name="prompt")
    check_cache(cache, model)  # before reset(): a cache built for another model is refused untouched
    cache.reset()
    return model(prompt, cache=cache, start_pos=0, last_only=True, check=False)[:, -1, :]


def prefill_by_steps(model, prompt: torch.Tensor, cache: KVCache, step) -> torch.Tensor:
    """prefill through a one-token decode step, `step(model, token (B, 1), cache) -> (B, V)` (generate's `step`),
    one prompt position at a time: T calls instead of one forward over T rows. It pays where the step is
    compiled and a forward over a few rows is slow: a quantized model whose several-row product dequantizes
    every weight on each call (FastGenerator prefills short prompts so). Same logits to float rounding."""
    check_token_ids(prompt, model.cfg.vocab_size, name="prompt")
    if prompt.shape[1] == 0:
        raise ValueError("prompt must hold at least one token per row to prefill by steps")
    check_cache(cache, model)
    cache.reset()
    columns = prompt.t().contiguous()  # (T, B): position t as a (B, 1) view with plain strides
    for t in range(prompt.shape[1]):
        logits = step(model, columns[t].view(-1, 1), cache)  # (B, V)
    return logits


@torch.no_grad()
def decode_one_token(model, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """One token (B, 1) at position cache.length; writes its K/V into the cache. Returns (B, V) logits."""
    # type and shape only: the id-range check reads the tensor, a device sync every step on a GPU
    check_token_ids(token, model.cfg.vocab_size, name="token", check_range=False)
    return model(token, cache=cache, check=False)[:, -1, :]


def check_logits_processors(logits_processors) -> tuple:
    """logits_processors as a tuple of callables proc(ids, logits) -> logits (a single callable is refused:
    it would be taken apart as an iterable, or silently ignored)."""
    if callable(logits_processors) or not all(callable(p) for p in logits_processors):
        raise ValueError(
            f"logits_processors must be a list of callables proc(ids, logits) -> logits; got {logits_processors!r}"
        )
    return tuple(logits_processors)


def prepare_generation(
    model, prompt, max_new_tokens, sampling: SamplingConfig | None, temperature: float, generator
) -> tuple[torch.Tensor, SamplingConfig]:
    """What every decode loop checks before any work: the generator, the prompt (returned as (B, T) long on
    the model's device), the length against the context window; and the SamplingConfig (built from
    `temperature` when none is given). Shared by generate, generate_without_cache and FastGenerator.generate."""
    check_generator(generator)  # here, before any work: greedy decoding would never look at it
    prompt = as_prompt_tensor(prompt, model)
    check_generation_length(prompt.shape[1], max_new_tokens, model.cfg.max_seq_len)
    if sampling is None:
        sampling = SamplingConfig(temperature=temperature)
    return prompt, sampling


def _progress(total, show):
    if not show:
        return None
    from .progress import progress_bar

    return progress_bar(total=total, desc="generating", unit="tok", leave=False)


@torch.no_grad()
def generate(
    model,
    prompt,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    sampling: SamplingConfig | None = None,
    generator: torch.Generator | None = None,
    eos_id: int | None = None,
    stop_sequences=(),
    cache: KVCache | None = None,
    progress: bool = False,
    stop_criteria=(),
    logits_processors=(),
    step=None,
    prefill=prefill,
) -> torch.Tensor:
    """Generate up to max_new_tokens after `prompt` with a KV cache. Returns (B, T + n_new) ids.

    temperature=0 (the default) is greedy decoding; pass `sampling=SamplingConfig(...)` for more.
    Stops early (batch size 1) at `eos_id` (kept in the output), at the end of a stop sequence, or
    when a stop criterion returns True (the token that triggered it is kept).

    logits_processors: each `proc(ids, logits) -> logits`, ids the (B, T_so_far) prompt + generated ids,
                       logits (B, V); applied in order before sampling (penalties and temperature after);
                       grammar.py's GrammarProcessor is one.
    step:              the decode step, `step(model, token (B, 1), cache) -> (B, V) logits`; default
                       decode_one_token. Another step (a compiled one, one for another cache) reuses
                       this loop and all its stop conditions and processors.
    prefill:           the prompt's pass, `prefill(model, prompt, cache) -> (B, V)` last-position logits, filling
                       cache positions 0..T-1; default one forward over the prompt (generate.prefill).
    """
    prompt, sampling = prepare_generation(model, prompt, max_new_tokens, sampling, temperature, generator)
    B, T = prompt.shape
    stop = stop_checker(B, eos_id, stop_sequences, stop_criteria)
    logits_processors = check_logits_processors(logits_processors)
    if step is not None and not callable(step):
        raise ValueError(f"step must be a callable step(model, token, cache) -> logits, or None; got {step!r}")
    step = decode_one_token if step is None else step
    if not callable(prefill):
        raise ValueError(f"prefill must be a callable prefill(model, prompt, cache) -> logits; got {prefill!r}")
    if cache is not None:  # the caller's: check it now rather than fail mid-generation
        check_cache(cache, model)
        # prefill writes T positions and each decode step one more; the last new token is never fed back
        needed = T + max(max_new_tokens - 1, 0)
        if cache.batch_size != B:
            raise ValueError(f"cache was built for batch size {cache.batch_size}; prompt has batch size {B}")
        if cache.max_seq_len < needed:
            raise ValueError(
                f"cache holds {cache.max_seq_len} positions but prompt ({T} tokens) + max_new_tokens "
                f"({max_new_tokens}) needs {needed}: build it with "
                f"KVCache.for_model(model, batch_size={B}, max_seq_len={needed})"
            )
    if max_new_tokens == 0:
        return prompt
    if cache is None:
        cache = KVCache.for_model(model, batch_size=B, max_seq_len=T + max_new_tokens)
    generated: list[int] = []  # only kept when a stop condition needs to look at the tokens
    penalised = sampling.repetition_penalty != 1.0 or sampling.presence_penalty or sampling.frequency_penalty
    out = torch.empty(B, T + max_new_tokens, dtype=torch.long, device=prompt.device)
    out[:, :T] = prompt
    bar = _progress(max_new_tokens, progress)
    logits = prefill(model, prompt, cache)  # (B, V)
    n = 0
    while True:
        for proc in logits_processors:
            logits = proc(out[:, : T + n], logits)  # (B, V)
        previous = out[:, : T + n] if penalised else None
        tok = next_token(logits, sampling, generator, previous)  # (B, 1)
        out[:, T + n] = tok[:, 0]
        n += 1
        if bar is not None:
            bar.update(1)
        if stop is not None:
            generated.append(int(tok[0, 0]))
        if n == max_new_tokens or (stop is not None and stop(generated)):
            break
        logits = step(model, tok, cache)
    if bar is not None:
        bar.close()
    return out[:, : T + n]


@torch.no_grad()
def generate_without_cache(model, prompt, max_new_tokens: int, **options) -> torch.Tensor:
    """The same loop without a cache: every step runs the model over the whole sequence so far.

    options: generate()'s keywords (temperature, sampling, generator, eos_id, stop_sequences, stop_criteria,
    progress), with its defaults; not cache, step or logits_processors."""
    o = keyword_options(generate, options, leave_out=("cache", "step", "logits_processors", "prefill"))
    prompt, sampling = prepare_generation(model, prompt, max_new_tokens, o.sampling, o.temperature, o.generator)
    B, T = prompt.shape
    stop = stop_checker(B, o.eos_id, o.stop_sequences, o.stop_criteria)
    generated: list[int] = []
    penalised = sampling.repetition_penalty != 1.0 or sampling.presence_penalty or sampling.frequency_penalty
    seq = prompt
    bar = _progress(max_new_tokens, o.progress)
    for _ in range(max_new_tokens):
        logits = model(seq, last_only=True, check=False)[:, -1, :]  # recompute every position: (B, V)
        tok = next_token(logits, sampling, o.generator, seq if penalised else None)
        seq = torch.cat([seq, tok], dim=1)
        if bar is not None:
            bar.update(1)
        if stop is not None:
            generated.append(int(tok[0, 0]))
            if stop(generated):
                break
    if bar is not None:
        bar.close()
    return seq


def generate_sliding_window(model, prompt, max_new_tokens: int, window: int, **generate_kwargs) -> torch.Tensor:
    """generate() on a RollingKVCache of `window` slots: every token attends only to the last `window`
    positions. Returns (B, T + n_new) ids, the same as running the model without a cache with
    attn_window=window; takes every keyword of generate() (sampling, stop conditions, logits processors,
    progress) except `cache` and `step`. Positions are still limited by the context window."""
    prompt = as_prompt_tensor(prompt, model)  # (B, T); generate() checks everything else
    cache = RollingKVCache.for_model(model, window, batch_size=prompt.shape[0])  # checks `window`
    return generate(model, prompt, max_new_tokens, cache=cache, **generate_kwargs)
