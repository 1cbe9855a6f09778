"""Beam search: keep the `num_beams` most likely partial outputs instead of one, and return the best finished one.

    beam_search(model, prompt, max_new_tokens, num_beams, length_penalty=1.0, early_stopping=False, eos_id=...)

Each step scores every (beam, next token) pair by its summed log-probability, keeps the best
2 * num_beams candidates, moves those that end in `eos_id` (or reach max_new_tokens) to a list of
finished hypotheses, and continues the best num_beams others. A finished hypothesis is ranked by
    score = sum of its token log-probabilities / (generated length) ** length_penalty
so length_penalty > 0 favours longer outputs, < 0 shorter ones, and 0 compares raw sums.

When to stop (`early_stopping`):
    True     as soon as num_beams hypotheses have finished;
    False    once num_beams have finished and the best running beam, scored at its current length,
             cannot beat the worst finished one (a heuristic: it may still have become better later);
    "never"  the same test, but with the best length the running beam could still reach when
             length_penalty > 0 (the exact bound for length_penalty <= 0 and "never").

The step is written the way HuggingFace's `generate(num_beams=..., do_sample=False)` writes its own,
decision for decision (tests/test_beam_search.py checks the tokens are identical), so the details
that look arbitrary (2 * num_beams candidates, only the top num_beams may finish, -1e9 for
"not allowed") are HuggingFace's. Logits processors (`proc(ids, logits) -> logits`, as in generate)
see log-probabilities here, as in HuggingFace's beam search, and rows are reordered between calls.

Out of scope: a batch of prompts, sampling inside beams, diverse/group beam search,
num_return_sequences > 1.
"""

from __future__ import annotations

import math

import torch

from .generate import as_prompt_tensor, check_generation_length, decode_one_token, prefill
from .kv_cache import KVCache

NOT_ALLOWED = -1.0e9  # HuggingFace's score for "must not be chosen" (a finite stand-in for -inf)


def check_beam_settings(num_beams, length_penalty, early_stopping) -> None:
    if not isinstance(num_beams, int) or isinstance(num_beams, bool) or num_beams < 1:
        raise ValueError(f"num_beams must be an int >= 1; got {num_beams!r}")
    if (
        not isinstance(length_penalty, (int, float))
        or isinstance(length_penalty, bool)
        or not math.isfinite(length_penalty)
    ):
        raise ValueError(f"length_penalty must be a finite number (1.0 = divide by the length); got {length_penalty!r}")
    if early_stopping not in (True, False, "never") or not isinstance(early_stopping, (bool, str)):
        raise ValueError(f"early_stopping must be True, False or 'never'; got {early_stopping!r}")


@torch.no_grad()
def beam_search(
    model,
    prompt,
    max_new_tokens: int,
    num_beams: int,
    *,
    length_penalty: float = 1.0,
    early_stopping=False,
    eos_id: int | None = None,
    logits_processors=(),
    return_score: bool = False,
):
    """The best finished hypothesis, (1, T + n) ids with n <= max_new_tokens (eos_id kept if it ended there).
    With return_score=True, also its score (summed log-probability / n ** length_penalty)."""
    check_beam_settings(num_beams, length_penalty, early_stopping)
    prompt = as_prompt_tensor(prompt, model)
    B, T = prompt.shape
    if B != 1:
        raise ValueError(f"beam_search takes one prompt (batch size 1); got batch size {B}")
    check_generation_length(T, max_new_tokens, model.cfg.max_seq_len)
    V = model.cfg.vocab_size
    if eos_id is not None and (not isinstance(eos_id, int) or isinstance(eos_id, bool) or not 0 <= eos_id < V):
        raise ValueError(f"eos_id must be a token id in [0, {V}) or None; got {eos_id!r}")
    processors = list(logits_processors)
    if not all(callable(p) for p in processors):
        raise ValueError("logits_processors must be callables proc(ids, logits) -> logits")
    if max_new_tokens == 0:
        return (prompt, 0.0) if return_score else prompt

    K, max_len = num_beams, T + max_new_tokens
    C = 2 * K  # candidates kept per step: enough that K survive even if the best K all finish
    dev = prompt.device
    running = prompt.new_zeros(K, max_len)  # (K, max_len) the running beams' tokens
    running[:, :T] = prompt
    running_scores = torch.zeros(K, device=dev)  # (K,) summed log-probabilities
    running_scores[1:] = NOT_ALLOWED  # all beams start equal: expand only the first at step one
    finished = running.clone()  # (K, max_len) the best finished hypotheses so far
    finished_scores = torch.full((K,), NOT_ALLOWED, device=dev)  # (K,) length-penalised
    finished_len = torch.zeros(K, dtype=torch.long, device=dev)  # (K,) their generated lengths
    is_finished = torch.zeros(K, dtype=torch.bool, device=dev)  # (K,) slot holds a real hypothesis
    improvable = True
    top_k_may_finish = torch.arange(C, device=dev) < K  # only the best K candidates may finish

    cache = KVCache.for_model(model, batch_size=K, max_seq_len=max_len)
    logits = prefill(model, running[:, :T], cache)  # (K, V): the prompt once per beam
    cur_len = T
    while True:
        log_probs = torch.log_softmax(logits.float(), dim=-1)  # (K, V)
        for proc in processors:
            log_probs = proc(running[:, :cur_len], log_probs)
        total = (log_probs + running_scores[:, None]).reshape(1, K * V)  # (1, K*V) every continuation
        cand_scores, flat = torch.topk(total, C)  # (1, C) best candidates over all beams
        cand_scores, flat = cand_scores[0], flat[0]
        parent, token = flat // V, flat % V  # (C,) which beam each extends, with which token
        candidates = running[parent].clone()  # (C, max_len)
        candidates[:, cur_len] = token
        ends = torch.full_like(token, cur_len + 1 >= max_len, dtype=torch.bool)  # (C,)
        if eos_id is not None:
            ends |= token == eos_id

        # the best K candidates that did not end keep running
        still_running = cand_scores + ends.to(torch.float32) * NOT_ALLOWED
        keep = torch.topk(still_running, K)[1]  # (K,)
        running, running_scores, origin = candidates[keep], still_running[keep], parent[keep]

        # those that ended (among the best K) compete, length-penalised, for the K finished slots
        just_finished = ends & top_k_may_finish
        penalised = cand_scores / ((cur_len + 1 - T) ** length_penalty)
        full = bool(is_finished.all()) and early_stopping is True
        penalised = penalised + float(full) * NOT_ALLOWED + float(not improvable) * NOT_ALLOWED
        penalised = penalised + (~just_finished) * NOT_ALLOWED
        merged_scores = torch.cat([finished_scores, penalised])  # (K + C,)
        best = torch.topk(merged_scores, K)[1]
        finished = torch.cat([finished, candidates])[best]
        finished_scores = merged_scores[best]
        finished_len = torch.cat([finished_len, torch.full_like(token, cur_len + 1 - T)])[best]
        is_finished = torch.cat([is_finished, just_finished])[best]

        cache.k.copy_(cache.k[:, origin])  # each running beam takes its parent's keys and values
        cache.v.copy_(cache.v[:, origin])
        cur_len += 1
        # can a running beam still beat the worst finished hypothesis?
        if early_stopping == "never" and length_penalty > 0.0:
            best_length = max_len - T
        else:
            best_length = cur_len - T
        best_possible = running_scores[0] / (best_length**length_penalty)
        worst = torch.where(is_finished, finished_scores.min(), torch.tensor(NOT_ALLOWED, device=dev))
        improvable = improvable and bool((best_possible > worst).any())
        if not improvable or (bool(is_finished.all()) and early_stopping is True) or bool(ends.all()):
            break
        logits = decode_one_token(model, running[:, cur_len - 1 : cur_len], cache)

    out = finished[:1, : T + int(finished_len[0])]
    return (out, float(finished_scores[0])) if return_score else out


@torch.no_grad()
def continuation_log_prob(model, ids, prompt_len: int) -> float:
    """Summed log-probability the model gives to ids[prompt_len:] after ids[:prompt_len] (teacher forcing)."""
    ids = as_prompt_tensor(ids, model)
    if not 1 <= prompt_len < ids.shape[1]:
        raise ValueError(f"prompt_len must be in [1, {ids.shape[1] - 1}]; got {prompt_len!r}")
    log_probs = torch.log_softmax(model(ids).float(), dim=-1)[0]  # (T, V)
    targets = ids[0, prompt_len:]
    return float(log_probs[prompt_len - 1 : -1].gather(-1, targets[:, None]).sum())
