"""What the engine accepts: each parameter of `Engine()` and `Engine.submit()` checked before anything is
allocated or queued, with a ValueError that names the parameter.

`InvalidParameter` is that ValueError with the parameter's name in `.param`, so a caller (the HTTP
server) can say which field was wrong without reading the message. The checks reuse the course's own
validators (`generate.as_prompt_tensor`, `generate.check_generation_length`,
`generate.check_logits_processors`, `stopping.as_stop_sequences`) and only add what serving needs: one
prompt per request, the pool's size, a seed torch can hold, an end-of-text id inside the vocabulary.

Degenerate values get a stated meaning rather than an error where one exists: a temperature above 0 but
below `GREEDY_BELOW` decodes greedily, as vLLM does (its _SAMPLING_EPS); in float32 a temperature of
1e-300 is 0, and dividing by it gave NaN for every request in the step.

Left out: checking what a logits processor or stop criterion does when called (the engine isolates
their failures instead: engine.py).
"""

from __future__ import annotations

import dataclasses
import math
import os
from contextlib import contextmanager

import torch

from ..generate import as_prompt_tensor, check_generation_length, check_logits_processors
from ..sampling import SamplingConfig
from ..stopping import as_stop_sequences

GREEDY_BELOW = 1e-5  # a temperature in (0, GREEDY_BELOW) is greedy decoding (vLLM's _SAMPLING_EPS)
SEED_MIN, SEED_MAX = -(1 << 63), (1 << 64) - 1  # what torch.Generator.manual_seed accepts


class InvalidParameter(ValueError):
    """A ValueError about one parameter, named in `.param`."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@contextmanager
def about(param: str):
    """Turn a ValueError raised inside (by a reused validator) into an InvalidParameter for `param`."""
    try:
        yield
    except InvalidParameter:
        raise
    except ValueError as e:
        raise InvalidParameter(param, str(e)) from None


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_count(name: str, value, minimum: int = 1) -> None:
    if not is_int(value) or value < minimum:
        raise InvalidParameter(name, f"{name} must be an int >= {minimum}; got {value!r}")


def check_flag(name: str, value) -> None:
    if not isinstance(value, bool):
        raise InvalidParameter(name, f"{name} must be True or False; got {value!r}")


def check_kv_pool(model, num_blocks, block_size, max_num_seqs) -> None:
    """Check Engine()'s model and the KV block pool it asks for: counts >= 1, blocks no longer than the
    context window, and the pool's bytes within the device's memory (where it can be read)."""
    cfg = getattr(model, "cfg", None)
    if not all(hasattr(cfg, a) for a in ("max_seq_len", "vocab_size", "n_layers")) or not hasattr(model, "device"):
        raise InvalidParameter("model", f"model must be a helpers.model.Transformer; got {type(model).__name__}")
    for name, value in (("num_blocks", num_blocks), ("block_size", block_size), ("max_num_seqs", max_num_seqs)):
        check_count(name, value)
    if block_size > cfg.max_seq_len:
        raise InvalidParameter(
            "block_size", f"block_size ({block_size}) must be at most the context window max_seq_len={cfg.max_seq_len}"
        )
    kv_bytes = 2 * cfg.n_layers * num_blocks * block_size * cfg.n_kv_heads * cfg.head_dim * model.dtype.itemsize
    memory = _device_memory(model.device)
    if memory is not None and kv_bytes > memory:
        raise InvalidParameter(
            "num_blocks",
            f"num_blocks={num_blocks:,} blocks of {block_size} tokens need "
            f"{kv_bytes / 2**30:,.1f} GiB of KV cache; the device has "
            f"{memory / 2**30:,.1f} GiB",
        )


def check_scheduling(
    cfg, max_num_seqs, max_num_batched_tokens, enable_prefix_caching, chunked_prefill, policy, step_log
) -> int:
    """Check Engine()'s scheduling parameters (after check_kv_pool); returns max_num_batched_tokens with its
    default filled in."""
    check_flag("enable_prefix_caching", enable_prefix_caching)
    check_flag("chunked_prefill", chunked_prefill)
    if policy not in ("continuous", "static"):
        raise InvalidParameter("policy", f"policy must be 'continuous' or 'static'; got {policy!r}")
    if step_log is not None:
        check_count("step_log", step_log)
    if max_num_batched_tokens is None:  # without chunking a whole prompt must fit one step
        return 256 if chunked_prefill else cfg.max_seq_len + max_num_seqs
    check_count("max_num_batched_tokens", max_num_batched_tokens)
    if not chunked_prefill and max_num_batched_tokens < cfg.max_seq_len:
        raise InvalidParameter(
            "max_num_batched_tokens",
            f"without chunked prefill max_num_batched_tokens ({max_num_batched_tokens}) must be "
            f">= max_seq_len ({cfg.max_seq_len}) so that any prompt fits one step",
        )
    return max_num_batched_tokens


def check_batch_invariant(
    model, batch_invariant, policy, enable_prefix_caching, chunked_prefill, max_num_seqs, max_num_batched_tokens
) -> int | None:
    """Check Engine(batch_invariant=...) against the other parameters; returns the scheduler's fixed prompt
    chunk in the mode (None outside it)."""
    check_flag("batch_invariant", batch_invariant)
    if not batch_invariant:
        return None
    if policy != "continuous":
        raise InvalidParameter("batch_invariant", f"batch_invariant=True needs policy='continuous'; got {policy!r}")
    if enable_prefix_caching:
        raise InvalidParameter(
            "batch_invariant",
            "batch_invariant=True cannot be combined with "
            "enable_prefix_caching=True: a cached prefix was computed in "
            "another request's steps",
        )
    if not chunked_prefill:
        return model.cfg.max_seq_len  # a whole prompt in one piece (check_scheduling: it fits the budget)
    if max_num_batched_tokens <= max_num_seqs:
        raise InvalidParameter(
            "max_num_batched_tokens",
            f"batch_invariant=True with chunked prefill needs max_num_batched_tokens "
            f"({max_num_batched_tokens}) > max_num_seqs ({max_num_seqs}): a prompt chunk of "
            f"their difference must fit beside max_num_seqs - 1 decoding requests",
        )
    return max_num_batched_tokens - max_num_seqs


def _device_memory(device) -> int | None:
    """Bytes of memory on `device` (physical memory for the CPU); None where it cannot be read."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    if device.type == "cpu" and hasattr(os, "sysconf"):
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return None
    return None


def check_prompt(prompt, model) -> list[int]:
    """One request's prompt: a list of ids, a 1-D tensor or a (1, T) tensor -> list of ids."""
    with about("prompt"):
        ids = as_prompt_tensor(prompt, model)  # (B, T), ids checked against the vocabulary
    if ids.shape[0] != 1:
        raise InvalidParameter(
            "prompt",
            f"prompt must be one sequence (a list, a 1-D tensor or shape (1, T)); got "
            f"shape {tuple(ids.shape)}: submit each row as its own request",
        )
    return ids[0].tolist()


def check_lengths(prompt_len: int, max_tokens, max_seq_len: int, block_size: int, num_blocks: int) -> None:
    """The prompt alone must leave room for a token; prompt + max_tokens must fit the window and the pool."""
    check_count("max_tokens", max_tokens)
    if prompt_len >= max_seq_len:
        raise InvalidParameter(
            "prompt",
            f"prompt has {prompt_len} tokens but the context window is max_seq_len="
            f"{max_seq_len}: a prompt may have at most {max_seq_len - 1} tokens",
        )
    with about("max_tokens"):
        check_generation_length(prompt_len, max_tokens, max_seq_len, name="max_tokens")
    for name, n in (("prompt", prompt_len + 1), ("max_tokens", prompt_len + max_tokens)):
        blocks = -(-(n - 1) // block_size)  # KV is kept for every position but the last generated token's
        if blocks > num_blocks:
            what = "the prompt" if name == "prompt" else "prompt + max_tokens"
            raise InvalidParameter(
                name,
                f"{what} needs {blocks} KV blocks of {block_size} tokens but the pool has "
                f"num_blocks={num_blocks}: it could never run",
            )


def check_sampling(sampling) -> SamplingConfig:
    """None (greedy) or a SamplingConfig; a temperature below GREEDY_BELOW becomes 0 (greedy)."""
    if sampling is None:
        return SamplingConfig(temperature=0.0)
    if not isinstance(sampling, SamplingConfig):
        raise InvalidParameter("sampling", f"sampling must be a SamplingConfig or None; got {type(sampling).__name__}")
    if 0 < sampling.temperature < GREEDY_BELOW:
        return dataclasses.replace(sampling, temperature=0.0)
    return sampling


def check_seed(seed) -> None:
    if seed is not None and (not is_int(seed) or not SEED_MIN <= seed <= SEED_MAX):
        raise InvalidParameter("seed", f"seed must be None or an int in [{SEED_MIN}, {SEED_MAX}]; got {seed!r}")


def check_stops(eos_id, stop_sequences, stop_criteria, vocab_size: int) -> list[list[int]]:
    if eos_id is not None and (not is_int(eos_id) or not 0 <= eos_id < vocab_size):
        raise InvalidParameter("eos_id", f"eos_id must be None or a token id in [0, {vocab_size - 1}]; got {eos_id!r}")
    with about("stop_sequences"):
        sequences = as_stop_sequences(stop_sequences)
    if any(not 0 <= t < vocab_size for s in sequences for t in s):
        raise InvalidParameter("stop_sequences", f"stop_sequences must hold token ids in [0, {vocab_size - 1}]")
    if (
        callable(stop_criteria)
        or isinstance(stop_criteria, (str, bytes))
        or not hasattr(stop_criteria, "__iter__")
        or not all(callable(c) for c in list(stop_criteria))
    ):
        raise InvalidParameter(
            "stop_criteria",
            f"stop_criteria must be a list of callables criterion(generated_ids) -> bool; got {stop_criteria!r}",
        )
    return sequences


def check_processors(logits_processors) -> tuple:
    if (
        callable(logits_processors)
        or not hasattr(logits_processors, "__iter__")
        or isinstance(logits_processors, (str, bytes))
    ):
        raise InvalidParameter(
            "logits_processors",
            f"logits_processors must be a list of callables proc(ids, logits) -> logits; got {logits_processors!r}",
        )
    with about("logits_processors"):  # a list first: a generator would be used up by the check
        return check_logits_processors(list(logits_processors))


def check_request_id(request_id) -> str | None:
    if request_id is None:
        return None
    if not (isinstance(request_id, str) and request_id) and not is_int(request_id):
        raise InvalidParameter("request_id", f"request_id must be None, a non-empty str or an int; got {request_id!r}")
    return str(request_id)


def check_arrival_time(arrival_time) -> float | None:
    if arrival_time is None:
        return None
    if (
        not isinstance(arrival_time, (int, float))
        or isinstance(arrival_time, bool)
        or not math.isfinite(arrival_time)
        or arrival_time < 0
    ):
        raise InvalidParameter(
            "arrival_time",
            f"arrival_time must be None or a finite number >= 0 (seconds on the engine's clock); got {arrival_time!r}",
        )
    return float(arrival_time)
