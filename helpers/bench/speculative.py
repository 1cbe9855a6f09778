"""Rows for chapter 12: speculative decoding (draft model, prompt lookup), eager and compiled, against plain
decoding."""

from __future__ import annotations

from functools import partial

import torch

from ..measure.timing import median, time_interleaved, timed
from .rows import Row, ratios


def row_against_plain(name, baseline, candidate, tb, tc, n_prompts, n_new, target, same_output, **fields) -> Row:
    """A row of speculative decoding against plain decoding from their interleaved times (tb, tc: one per
    generation of n_new tokens, n_prompts per repeat): one ratio per repeat, of its prompts' total times, and
    each side's throughput in tokens/s."""
    tok_s = [f"{n_new * len(t) / sum(t):.0f} tok/s" for t in (tb, tc)]
    pairs = repeat_ratios(tb, tc, n_prompts)
    return Row(name, baseline, candidate, pairs, *tok_s, target=target, same_output=same_output, **fields)


def repeat_ratios(tb, tc, n_prompts) -> list[float]:
    """One ratio per repeat: its n_prompts baseline times over its candidate times."""
    return [sum(tb[i : i + n_prompts]) / sum(tc[i : i + n_prompts]) for i in range(0, len(tb), n_prompts)]


def rows_speculative(target, draft, tok, n_new: int, repeats: int, progress) -> list[Row]:
    """Speculative decoding (shipped draft; prompt lookup) against plain cached decoding, on code prompts,
    plus the premise it rests on: scoring gamma + 1 tokens in one pass costs about one decode step."""
    from ..data import validation_documents
    from ..generate import generate
    from ..kv_cache import KVCache
    from ..speculative import DEFAULT_GAMMA, SpeculativeStats, prompt_lookup_generate, speculative_generate

    docs = validation_documents()
    prompts = [tok.encode(docs[i][:400], bos=True)[:64] for i in (3, 11, 19)]  # three held-out files
    rows = []
    stats = {}

    def plain(p, temperature, g):
        return generate(target, p, n_new, temperature=temperature, generator=g)

    def speculative(label, p, temperature, g):  # the row's candidate; draft-model rows keep their statistics
        if "prompt lookup" in label:
            return prompt_lookup_generate(target, p, n_new)[0]
        out, st = speculative_generate(target, draft, p, n_new, temperature=temperature, generator=g)
        stats[label] = stats.get(label, SpeculativeStats()).merge(st)
        return out

    for label, temperature, target_ratio in [
        ("speculative, draft model, greedy", 0.0, 2.0),
        ("speculative, draft model, T=1", 1.0, 1.3),
        ("speculative, prompt lookup, greedy", 0.0, None),
    ]:
        tb, tc, same = [], [], True
        for r in range(repeats):
            for p in prompts:
                gb, gc = torch.Generator().manual_seed(r), torch.Generator().manual_seed(r)
                seconds, out_b = timed(partial(plain, p, temperature, gb), target.device)
                tb.append(seconds)
                seconds, out_c = timed(partial(speculative, label, p, temperature, gc), target.device)
                tc.append(seconds)
                if temperature == 0:
                    same &= torch.equal(out_b, out_c)
        progress()
        note = "" if temperature == 0 else "distribution: tests/test_speculative.py"
        if label in stats:  # draft-model rows: how often the draft was right
            st = stats[label]
            note = f"alpha {st.acceptance_rate:.2f}, {st.tokens_per_target_call:.2f} tokens/target call " + note
        same_out = same if temperature == 0 else None
        names = (label + " vs plain", "plain cached", "speculative")
        rows.append(row_against_plain(*names, tb, tc, len(prompts), n_new, target_ratio, same_out, note=note.strip()))

    # the premise: one target pass over gamma + 1 tokens vs one single-token step, at position 64..
    ids = torch.tensor([prompts[0]], device=target.device)
    cache = KVCache.for_model(target, 1, ids.shape[1] + DEFAULT_GAMMA + 1)
    nxt = torch.zeros(1, DEFAULT_GAMMA + 1, dtype=torch.long, device=target.device)

    def step(T):
        def run():
            cache.truncate(ids.shape[1])
            target(nxt[:, :T], cache=cache, check=False)

        return run

    with torch.inference_mode():
        target(ids, cache=cache)
        tb, tc = time_interleaved([step(DEFAULT_GAMMA + 1), step(1)], target.device, 30 * repeats, warmup=5)
    rows.append(
        Row(
            f"cost of a {DEFAULT_GAMMA + 1}-token verify pass / 1 step",
            f"{DEFAULT_GAMMA + 1} tokens",
            "1 token",
            ratios(tb, tc),
            f"{median(tb) * 1e3:.2f} ms",
            f"{median(tc) * 1e3:.2f} ms",
            note="speculation pays when this is near 1 (memory-bound decode)",
        )
    )
    return rows


def rows_speculative_compiled(
    target,
    draft,
    tok,
    n_new: int,
    repeats: int,
    fast,
    progress,
    gamma: int | None = None,
    sampled_gamma: int | None = None,
    label: str = "",
    fused_only: bool = False,
) -> list[Row]:
    """Speculative decoding with compiled draft and verify steps (FastGenerators, helpers.speculative) against
    plain compiled decoding (`fast`, the same generator as the target's), on rows_speculative's prompts:
    greedy and T=1, each with every round one compiled graph (the default) and with the models called one
    at a time. Plus the compiled premise (a (gamma + 1)-token verify pass against a 1-token step, for both
    gammas), and for each row the most the measured costs allow: tokens per target call / (v + gamma * c),
    the cost model of chapter 12 with no loop overhead, the same with a verify pass as cheap as one
    step (v = 1); for the rows with each round one graph, that graph's own cost R in target steps, tokens per
    target call / R (the bound the row is judged against: the measured speed-up over it is printed), and
    (gamma + 1) / R, the most any draft of this cost could give even if every proposal were accepted; and
    what the same costs allow once each generation's prefill is counted (plain: its eager prefill; speculative:
    both models' prefill as one compiled graph, speculative.prefill): (P_plain + n_new - 1) / (P_spec +
    rounds * R), prefills in steps. Costs are timed warm, in blocks of calls. The draft's generator autotunes
    its GEMM when `fast` does (so then does each round); `label` is added to the row names, and fused_only
    keeps the rows with each round one graph."""
    from ..data import validation_documents
    from ..fast_decode import FastGenerator, guards_checked_once
    from ..generate import prefill
    from ..speculative import (
        DEFAULT_COMPILED_GAMMA,
        DEFAULT_COMPILED_SAMPLED_GAMMA,
        SpeculativeStats,
        fused_prefill,
        fused_round_call,
        fused_rounds,
        speculative_generate,
        warmup_speculative,
    )

    gamma = DEFAULT_COMPILED_GAMMA if gamma is None else gamma
    sampled_gamma = DEFAULT_COMPILED_SAMPLED_GAMMA if sampled_gamma is None else sampled_gamma
    docs = validation_documents()
    prompts = [tok.encode(docs[i][:400], bos=True)[:64] for i in (3, 11, 19)]  # three held-out files
    fast_draft = FastGenerator(draft, max_seq_len=fast.cache.max_seq_len, gemm_autotune=fast.gemm_autotune)
    # before any timing: compiling is not decoding (both models' prefill too: one graph for the prompts' bucket)
    lengths = sorted({len(p) for p in prompts})
    warmup_speculative(fast, fast_draft, gamma, prompt_lengths=lengths)
    warmup_speculative(fast, fast_draft, sampled_gamma, temperature=1.0, prompt_lengths=lengths)
    rounds = {
        0.0: fused_rounds(fast, fast_draft, gamma, sampled=False),
        1.0: fused_rounds(fast, fast_draft, sampled_gamma, sampled=True),
    }
    secs = {t: r.compile_seconds if r is not None else 0.0 for t, r in rounds.items()}
    gammas = sorted({gamma, sampled_gamma})
    compiled = all(g + 1 in fast.compiled_token_counts for g in gammas) and 2 in fast_draft.compiled_token_counts
    verify_note = ", ".join(
        f"{g + 1}-token verify graph {fast.compile_seconds_by_tokens.get(g + 1, 0):.0f} s" for g in gammas
    )

    def compile_note(temperature):
        if not compiled:
            return "compile unavailable: eager static path"
        return f"{verify_note}, draft graphs {fast_draft.compile_seconds:.0f} s, round graph {secs[temperature]:.0f} s"

    # the premise, compiled: a (gamma + 1)-token verify pass vs a 1-token step, at positions 64..
    T0 = len(prompts[0])
    counts = {1, *(g + 1 for g in gammas)}
    tokens = {T: torch.zeros(1, T, dtype=torch.long, device=target.device) for T in counts}
    positions = {T: torch.arange(T0, T0 + T, device=target.device) for T in counts}

    def step(T):
        return lambda: fast.forward(tokens[T], positions[T])

    # each timed warm, in blocks of 5 calls (measure.timing.time_interleaved): called one after the other, the step and
    # the verify pass (two copies of the weights) or the draft evict each other's data from the CPU's caches
    # and without dynamo's guard checks, as the plain and speculative loops run after their first step (every
    # graph here has had them checked: fast_decode.guards_checked_once)
    verify_times, warm = {}, dict(repeats=10 * repeats, warmup=5, block=5)
    with torch.no_grad(), guards_checked_once():
        for g in gammas:
            verify_times[g] = time_interleaved([step(g + 1), step(1)], target.device, **warm)
        # and what a draft proposal costs next to a target step: gamma of them per round
        td, t1 = time_interleaved([lambda: fast_draft.forward(tokens[1], positions[1]), step(1)], target.device, **warm)
        # a whole round as one graph (gamma draft steps inside it, then the verify pass), where it compiled, is
        # timed in the rows' own time window (below): on a shared machine a cost timed minutes apart from the
        # generations it bounds can be off by more than the gap being measured
        round_calls = {
            t: fused_round_call(fast, fast_draft, g, T0, sampled=t > 0) for t, g in ((0.0, gamma), (1.0, sampled_gamma))
        }
        # each generation's prefill, in target steps: plain compiled decoding's (eager, FastGenerator.generate's)
        # and the speculative one's (both models, one compiled graph where it compiled, else each eagerly)
        prompt0 = torch.tensor([prompts[0]], device=target.device)  # (1, T0)
        both = fused_prefill(fast, fast_draft, T0)

        def eager_prefill(gen, ids):
            return lambda: prefill(gen.decode_model, ids, gen.cache)

        spec_prefill = (
            (lambda: both(prompt0[:, :-1]))
            if both is not None
            else lambda: (eager_prefill(fast, prompt0[:, :-1])(), eager_prefill(fast_draft, prompt0[:, :-1])())
        )
        tp, tq, ts = time_interleaved(
            [eager_prefill(fast, prompt0), spec_prefill, step(1)], target.device, repeats=2 * repeats, warmup=2, block=3
        )
        p_plain, p_spec = median(tp) / median(ts), median(tq) / median(ts)
    v = {g: median(tv) / median(t) for g, (tv, t) in verify_times.items()}
    c = median(td) / median(t1)

    rows, stats = [], {}
    variants = [
        ("greedy", 0.0, gamma, True, 2.0),
        ("greedy, models called one at a time", 0.0, gamma, False, None),
        ("T=1", 1.0, sampled_gamma, True, 1.3),
        ("T=1, models called one at a time", 1.0, sampled_gamma, False, None),
    ]
    if fused_only:
        variants = [v for v in variants if v[3]]
    for name, temperature, g, fuse, target_ratio in variants:
        tb, tc, same, round_times, step_times = [], [], True, [], []
        plain = partial(fast.generate, max_new_tokens=n_new, temperature=temperature)
        spec = partial(
            speculative_generate,
            fast,
            fast_draft,
            max_new_tokens=n_new,
            gamma=g,
            temperature=temperature,
            fuse_rounds=fuse,
        )
        for r in range(repeats):
            for p in prompts:
                gb, gc = torch.Generator().manual_seed(r), torch.Generator().manual_seed(r)
                seconds, out_b = timed(partial(plain, p, generator=gb), target.device)
                tb.append(seconds)
                seconds, (out_c, st) = timed(partial(spec, p, generator=gc), target.device)
                tc.append(seconds)
                stats[name] = stats.get(name, SpeculativeStats()).merge(st)
                if temperature == 0:
                    same &= torch.equal(out_b, out_c)
            run = round_calls[temperature] if fuse else None
            if run is not None:  # after each repeat's generations, long blocks of rounds against target steps
                # (40 calls each, as the loops call them: run in turns of 5, the step after a turn of rounds read
                # as 2.0 steps per round where turns of 40 read 2.2-2.5, the loops' own 2.5, on two autotuned
                # generators, whose round holds its own packed copy of the weights)
                with torch.no_grad(), guards_checked_once():
                    tr, ts = time_interleaved([run, step(1)], target.device, repeats=2, warmup=1, block=40)
                round_times += tr
                step_times += ts
        progress()
        st = stats[name]
        e = st.tokens_per_target_call
        model_bound, free_verify = e / (v[g] + g * c), e / (1 + g * c)
        R = median(round_times) / median(step_times) if round_times else None  # the round graph, in target steps
        # what the round graph allows, and with every proposal accepted: what no draft of this cost can beat;
        # and what it allows once both generations' prefills are counted (rounds per generation as measured)
        round_bound, all_accepted = (e / R, (g + 1) / R) if R else (None, None)
        measured = median(repeat_ratios(tb, tc, len(prompts)))
        with_prefill = ((p_plain + n_new - 1) / (p_spec + st.target_calls / len(tc) * R)) if R else None
        note = (
            f"gamma {g}, alpha {st.acceptance_rate:.2f}, {e:.2f} tokens/target call, v {v[g]:.2f}; the costs "
            f"allow {model_bound:.2f}x, {free_verify:.2f}x with v = 1"
            + (
                f"; a round graph costs {R:.2f} steps: bound {round_bound:.2f}x, measured {measured:.2f}x = "
                f"{measured / round_bound:.2f} of it; {all_accepted:.2f}x accepting every proposal; with the "
                f"prefills (plain {p_plain:.1f} steps, speculative {p_spec:.1f}{'' if both else ' eager'}) "
                f"{with_prefill:.2f}x"
                if R
                else ""
            )
            + (", distribution: tests/test_speculative.py" if temperature else "")
            + f"; {compile_note(temperature)}"
        )
        rows.append(
            row_against_plain(
                f"speculative compiled{label}, draft model, {name} vs plain compiled{label}",
                "plain compiled",
                "speculative compiled",
                tb,
                tc,
                len(prompts),
                n_new,
                target_ratio,
                same if temperature == 0 else None,
                note=note,
                extra={
                    "alpha": st.acceptance_rate,
                    "tokens_per_target_call": e,
                    "gamma": g,
                    "compile_seconds": secs[temperature],
                    "fused_rounds": fuse,
                    "cost_model_bound": model_bound,
                    "bound_with_free_verify": free_verify,
                    "round_graph_steps": R,
                    "round_graph_bound": round_bound,
                    "measured_over_round_graph_bound": measured / round_bound if R else None,
                    "prefill_steps_plain": p_plain,
                    "prefill_steps_speculative": p_spec,
                    "round_graph_bound_with_prefills": with_prefill,
                    "bound_accepting_every_proposal": all_accepted,
                },
            )
        )
    for g in gammas:
        tv, t = verify_times[g]
        rows.append(
            Row(
                f"compiled{label}: cost of a {g + 1}-token verify pass / 1 step",
                f"{g + 1} tokens",
                "1 token",
                ratios(tv, t),
                f"{median(tv) * 1e3:.2f} ms",
                f"{median(t) * 1e3:.2f} ms",
                note=f"speculation pays when this is near 1; a draft step costs {c:.2f} target steps",
                extra={"draft_step_over_target_step": c},
            )
        )
    return rows
