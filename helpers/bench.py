"""One benchmark command: every speed claim of the course, as ratios measured side by side in one run.

    python -m helpers.bench            # full run (several minutes on a 2-core CPU)
    python -m helpers.bench --quick    # about a minute: shorter generations, fewer repeats

Each row times a candidate against its baseline in the same process, interleaved (A B A B ...), and
reports the median ratio with its min-max over the repeats, the absolute medians, the device, and the
target the course set for it. Tokens are compared too: a speedup that changes the output is a bug.
It is a benchmark, not a test: nothing here fails on a slow machine.

Writes bench_summary.png (ratios against their targets), bench_cache_latency.png (per-token time
against position, with and without the KV cache) and bench_results.json into .cache/figures/
(LLM_COURSE_FIGURES=figures to refresh the committed ones). BENCHMARKS.md holds the last full run.

Speculative decoding is timed twice: the eager loop against plain eager decoding, and the loop on
compiled draft and verify steps (FastGenerators) against plain compiled decoding.

Rows for chapter 07: what each lever of the compiled step buys (inductor's C++ wrapper, the buffer sized
to the generation, prefill's share of the time), the compiled step against its roofline ceiling, bf16
against fp32 (all-bf16 eager, and bf16 / fp16 weights with fp32 arithmetic in the compiled step), and
llama.cpp on the same weights (GGUF f32 and f16) when llama-cpp-python is installed (`pip install -r
requirements-ci.txt`: it builds llama.cpp from source, about 10-12 minutes on 2 cores; CI installs it).
Rows for chapter 13 come from helpers/serving/bench.py (continuous vs sequential and
static batching, KV utilisation, prefix caching, chunked prefill).
"""
from __future__ import annotations

import argparse
import json
import platform
from dataclasses import asdict, dataclass, field
from functools import partial

import torch

from .device import default_device, default_dtype
from .measure.timing import compiled_step_seconds, decode_step_seconds, median, step_seconds, time_interleaved, timed
from .paths import figures_dir


@dataclass
class Row:
    name: str
    baseline: str
    candidate: str
    ratios: list[float]  # baseline time / candidate time, one per interleaved repeat
    baseline_abs: str
    candidate_abs: str
    target: float | None = None  # the course's goal for the ratio (>=)
    note: str = ""
    same_output: bool | None = None
    extra: dict = field(default_factory=dict)

    @property
    def median(self) -> float:
        return median(self.ratios)

    def line(self) -> str:
        lo, hi = min(self.ratios), max(self.ratios)
        goal = ""
        if self.target is not None:
            goal = f">= {self.target:g}x " + ("met" if self.median >= self.target else "MISSED")
        same = "" if self.same_output is None else ("same tokens" if self.same_output else "DIFFERENT TOKENS")
        return (f"{self.name:46s} {self.median:6.2f}x [{lo:.2f}-{hi:.2f}]  {self.baseline_abs:>16s} -> "
                f"{self.candidate_abs:<16s} {goal:14s} {same} {self.note}")


def _ratios(tb, tc):
    return [b / c for b, c in zip(tb, tc)]


# ---- rows -------------------------------------------------------------------------------------
@torch.no_grad()
def per_token_times(model, prompt_ids, n_new: int, use_cache: bool) -> list[float]:
    """Seconds for each generated token (greedy), with or without the KV cache: the first is the prefill (the
    whole prompt; recomputed or cached), each later one a step over the sequence so far (recomputed) or one
    token (cached)."""
    from .generate import as_prompt_tensor, decode_one_token, prefill
    from .kv_cache import KVCache

    device = model.device
    seq = as_prompt_tensor(prompt_ids, model)  # (1, T)
    if use_cache:
        cache = KVCache.for_model(model, max_seq_len=seq.shape[1] + n_new)
        first, logits = timed(lambda: prefill(model, seq, cache), device)  # (1, V)
        token = logits.argmax(-1, keepdim=True)  # (1, 1)
        later = step_seconds(lambda t: decode_one_token(model, t, cache), token, n_new - 1, device) if n_new > 1 else []
        return [first] + later

    def append_greedy(s, logits):  # (1, T), (1, V) -> (1, T + 1)
        return torch.cat([s, logits.argmax(-1, keepdim=True)], dim=1)

    return step_seconds(lambda s: model(s, last_only=True, check=False)[:, -1], seq, n_new, device,
                        advance=append_greedy)


def row_cache_vs_recompute(model, tok, n_new: int, repeats: int, progress) -> tuple[Row, dict]:
    prompt = tok.encode("import os\n", bos=True)
    n_new = min(n_new, model.cfg.max_seq_len - len(prompt))  # the whole context window at most
    cached_runs, uncached_runs = [], []
    for _ in range(repeats):
        uncached_runs.append(per_token_times(model, prompt, n_new, use_cache=False))
        cached_runs.append(per_token_times(model, prompt, n_new, use_cache=True))
        progress()
    tb = [sum(r) for r in uncached_runs]
    tc = [sum(r) for r in cached_runs]
    k = min(64, n_new // 4)
    cached_med = [median(x) for x in zip(*cached_runs)]
    growth = median(cached_med[-k:]) / median(cached_med[1:k + 1])
    row = Row(f"KV cache vs recompute, {n_new} tokens", "recompute", "KV cache", _ratios(tb, tc),
              f"{n_new / median(tb):.0f} tok/s", f"{n_new / median(tc):.0f} tok/s",
              target=15.0 if n_new >= 1000 else None,
              note=f"cached per-token time, last {k} / first {k}: {growth:.2f}x (goal <= 1.5)",
              extra={"cached_growth": growth})
    curves = {"cached": cached_med, "uncached": [median(x) for x in zip(*uncached_runs)]}
    return row, curves


def row_vs_transformers(model, tok, n_new: int, repeats: int, fast, progress) -> list[Row]:
    from .generate import generate
    from .hf import to_hf_llama

    hf = to_hf_llama(model)
    prompt = torch.tensor([tok.encode("def main():\n", bos=True)], device=model.device)

    def theirs():
        return hf.generate(prompt, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False)

    def ours():
        return generate(model, prompt, n_new)

    ref = theirs()
    rows = []
    candidates = [("helpers eager loop", ours)]
    if fast is not None:
        candidates.append(("helpers compiled step", lambda: fast.generate(prompt, n_new)))
    for label, fn in candidates:
        same = torch.equal(fn(), ref)
        tb, tc = time_interleaved([theirs, fn], model.device, repeats)
        progress()
        rows.append(Row(f"{label} vs transformers generate", "HF generate", label, _ratios(tb, tc),
                        f"{n_new / median(tb):.0f} tok/s", f"{n_new / median(tc):.0f} tok/s",
                        target=3.0, same_output=same, note=f"{n_new} greedy tokens"))
    return rows


def random_model(preset: str, device, dtype):
    from .model import ModelConfig, Transformer

    torch.manual_seed(0)
    return Transformer(ModelConfig.from_preset(preset)).to(device=device, dtype=dtype).eval()


def row_decode_bandwidth(model, repeats: int, progress) -> Row:
    """Batch-1 decode on a random-weight model too big for any cache: bytes it must read per token
    (all matmul weights + the KV cache so far) / time per token, against measured copy bandwidth."""
    from .measure.flops import matmul_parameters
    from .measure.roofline import measure_copy_bandwidth

    cfg, device = model.cfg, model.device
    elem = model.embed.weight.element_size()
    n_steps, context = 16, 16
    bw_runs, step_runs = [], []
    for _ in range(repeats):
        bw_runs.append(measure_copy_bandwidth(device).per_second)
        step_runs.append(decode_step_seconds(model, n_steps, context))
        progress()
    avg_pos = context + n_steps / 2
    kv_read = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * avg_pos * elem
    bytes_per_token = matmul_parameters(cfg) * elem + kv_read
    achieved = [bytes_per_token / s for s in step_runs]
    return Row(f"decode bandwidth, {matmul_parameters(cfg) / 1e6:.0f}M random weights", "copy bandwidth",
               "decode", [a / b for a, b in zip(achieved, bw_runs)],
               f"{median(bw_runs) / 1e9:.1f} GB/s copy",
               f"{median(achieved) / 1e9:.1f} GB/s decode",
               target=0.6, note=f"{bytes_per_token / 1e6:.0f} MB read per token, "
                                f"{median(step_runs) * 1e3:.1f} ms/token (ratio, not speedup)")


def rows_quantized(model, repeats: int, progress) -> list[Row]:
    """Weight-only int8 / int4 with torch's real kernels against the same model unquantized."""
    from .quantize import quantize_model

    variants = [("int8 weight-only", "int8", "auto", 2.0), ("int4 weight-only, group 64", "int4", "auto", 3.0)]
    if model.device.type == "cpu":
        variants.insert(1, ("int8 dynamic (activations too)", "int8", "dynamic", None))
    base_name = "fp32" if model.dtype == torch.float32 else str(model.dtype).replace("torch.", "")
    rows = []
    for label, method, kernel, target in variants:
        qmodel = quantize_model(model, method, group_size=64, kernel=kernel)
        tb, tc = [], []
        for _ in range(repeats):
            tb.append(decode_step_seconds(model))
            tc.append(decode_step_seconds(qmodel))
        progress()
        rows.append(Row(f"{label} vs {base_name}, batch-1 decode", base_name, label, _ratios(tb, tc),
                        f"{1 / median(tb):.1f} tok/s", f"{1 / median(tc):.1f} tok/s",
                        target=target, note=f"{model.num_parameters() / 1e6:.0f}M random weights"))
        del qmodel
    return rows


def decode_byte_ratio(model, qmodel, n_past: int) -> float:
    """Bytes a batch-1 step must read, unquantized / quantized: every matmul weight (codes, scales and
    zeros for the quantized layers; the full-precision head) plus the KV cache so far. Norms are ignored."""
    from .measure.flops import forward_bytes
    from .quantize import weight_bytes_breakdown

    elem = model.embed.weight.element_size()
    kv = forward_bytes(model.cfg, 1, n_past, bytes_per_weight=0, bytes_per_kv=elem)
    q = weight_bytes_breakdown(qmodel)
    head = qmodel.head.weight.numel() * qmodel.head.weight.element_size() if hasattr(qmodel.head, "weight") else 0
    quantized = q["weights"] + q["scales"] + q["zeros"] + head + kv
    return forward_bytes(model.cfg, 1, n_past, bytes_per_weight=elem, bytes_per_kv=elem) / quantized


def _time_against_compiled(base, model, repeats: int, n_steps: int = 16, context: int = 16):
    """Compile `model`'s batch-1 step with base's buffer size, then time base's step and it, interleaved.
    Returns (base seconds, candidate seconds, warm-up seconds, where the candidate's code came from)."""
    from .fast_decode import FastGenerator

    fast = FastGenerator(model, max_seq_len=base.cache.max_seq_len)
    secs = fast.warmup()
    tb, tc = [], []
    for _ in range(repeats):
        tb.append(compiled_step_seconds(base, n_steps, context))
        tc.append(compiled_step_seconds(fast, n_steps, context))
    return tb, tc, secs, fast.compile_source


def rows_quantized_compiled(model, repeats: int, progress) -> list[Row]:
    """Weight-only int8 / int4 in the compiled batch-1 step (FastGenerator) against the unquantized compiled step:
    torch's library kernels ("int8pack", "int4pack", called from the compiled graph) and the "fused_dequant"
    formulation that inductor generates as one dequantize-multiply-sum loop. Target: half the speedup the
    bytes read per step allow. Each quantized model compiles its own step (about 30-60 s each on 2 cores)."""
    from .fast_decode import FastGenerator
    from .quantize import quantize_model

    n_steps, context = 16, 16
    S = context + n_steps + 1
    base_name = "fp32" if model.dtype == torch.float32 else str(model.dtype).replace("torch.", "")
    base = FastGenerator(model, max_seq_len=S)
    base.warmup()
    variants = [("int8", "int8pack"), ("int8", "fused_dequant"), ("int4", "int4pack"), ("int4", "fused_dequant")]
    rows = []
    for method, kernel in variants:
        qmodel = quantize_model(model, method, group_size=64, kernel=kernel)
        tb, tc, secs, source = _time_against_compiled(base, qmodel, repeats, n_steps, context)
        bound = decode_byte_ratio(model, qmodel, context + n_steps // 2)
        progress()
        label = f"{method} weight-only" + (", group 64" if method == "int4" else "")
        rows.append(Row(f"{label} compiled ({kernel}) vs {base_name} compiled, batch-1 decode", f"{base_name} compiled",
                        f"{method} {kernel}", _ratios(tb, tc), f"{median(tb) * 1e3:.1f} ms",
                        f"{median(tc) * 1e3:.1f} ms", target=round(bound / 2, 2),
                        note=f"byte ratio {bound:.2f}x; {source} in {secs:.0f} s; "
                             f"{model.num_parameters() / 1e6:.0f}M random weights"))
        del qmodel
    return rows


def quantized_quality(model, tok, n_windows: int = 8) -> str:
    """Validation bits/byte and top-1 agreement of the course model's int8 / int4 / bf16 / fp16 copies."""
    from .data import encode_documents, validation_documents
    from .measure.evaluate import bits_per_byte
    from .quantize import quantize_model

    ids = encode_documents(tok, validation_documents())
    ref = bits_per_byte(model, tok, ids, max_windows=n_windows)["bits_per_byte"]
    x = torch.tensor(ids[:513].astype("int64"), device=model.device).unsqueeze(0)
    with torch.no_grad():
        top_ref = model(x[:, :-1]).argmax(-1)
    parts = [f"course model: {ref:.4f} bits/byte"]
    for method in ("int8", "int4", "bf16", "fp16"):
        q = quantize_model(model, method, group_size=64)
        bpb = bits_per_byte(q, tok, ids, max_windows=n_windows)["bits_per_byte"]
        with torch.no_grad():
            agree = (q(x[:, :-1]).argmax(-1) == top_ref).float().mean().item()
        parts.append(f"{method} {bpb - ref:+.4f} bits/byte, top-1 agreement {agree:.1%}")
    return "; ".join(parts)


def rows_speculative(target, draft, tok, n_new: int, repeats: int, progress) -> list[Row]:
    """Speculative decoding (shipped draft; prompt lookup) against plain cached decoding, on code prompts,
    plus the premise it rests on: scoring gamma + 1 tokens in one pass costs about one decode step."""
    from .data import validation_documents
    from .generate import generate
    from .kv_cache import KVCache
    from .speculative import DEFAULT_GAMMA, SpeculativeStats, prompt_lookup_generate, speculative_generate

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

    for label, temperature, target_ratio in [("speculative, draft model, greedy", 0.0, 2.0),
                                             ("speculative, draft model, T=1", 1.0, 1.3),
                                             ("speculative, prompt lookup, greedy", 0.0, None)]:
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
        pairs = [sum(tb[i:i + len(prompts)]) / sum(tc[i:i + len(prompts)]) for i in range(0, len(tb), len(prompts))]
        note = "" if temperature == 0 else "distribution: tests/test_speculative.py"
        if label in stats:  # draft-model rows: how often the draft was right
            st = stats[label]
            note = f"alpha {st.acceptance_rate:.2f}, {st.tokens_per_target_call:.2f} tokens/target call " + note
        rows.append(Row(label + " vs plain", "plain cached", "speculative", pairs,
                        f"{n_new * len(tb) / sum(tb):.0f} tok/s", f"{n_new * len(tc) / sum(tc):.0f} tok/s",
                        target=target_ratio, same_output=same if temperature == 0 else None, note=note.strip()))

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
    rows.append(Row(f"cost of a {DEFAULT_GAMMA + 1}-token verify pass / 1 step", f"{DEFAULT_GAMMA + 1} tokens",
                    "1 token", _ratios(tb, tc), f"{median(tb) * 1e3:.2f} ms",
                    f"{median(tc) * 1e3:.2f} ms",
                    note="speculation pays when this is near 1 (memory-bound decode)"))
    return rows


def rows_speculative_compiled(target, draft, tok, n_new: int, repeats: int, fast, progress,
                              gamma: int | None = None, sampled_gamma: int | None = None, label: str = "",
                              fused_only: bool = False) -> list[Row]:
    """Speculative decoding with compiled draft and verify steps (FastGenerators, speculative.py) against
    plain compiled decoding (`fast`, the same generator as the target's), on rows_speculative's prompts:
    greedy and T=1, each with every round one compiled graph (the default) and with the models called one
    at a time. Plus the compiled premise (a (gamma + 1)-token verify pass against a 1-token step, for both
    gammas), and for each row the most the measured costs allow: tokens per target call / (v + gamma * c),
    the cost model of chapter 12 with no loop overhead, the same with a verify pass as cheap as one
    step (v = 1); for the rows with each round one graph, that graph's own cost R in target steps, tokens per
    target call / R, and (gamma + 1) / R, the most any draft of this cost could give even if every proposal
    were accepted. Costs are timed warm, in blocks of calls. The draft's generator autotunes its GEMM when
    `fast` does (so then does each round); `label` is added to the row names, and fused_only keeps the rows
    with each round one graph."""
    from .data import validation_documents
    from .fast_decode import FastGenerator, guards_checked_once
    from .speculative import (
        DEFAULT_COMPILED_GAMMA,
        DEFAULT_COMPILED_SAMPLED_GAMMA,
        SpeculativeStats,
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
    # before any timing: compiling is not decoding
    warmup_speculative(fast, fast_draft, gamma)
    warmup_speculative(fast, fast_draft, sampled_gamma, temperature=1.0)
    rounds = {0.0: fused_rounds(fast, fast_draft, gamma, sampled=False),
              1.0: fused_rounds(fast, fast_draft, sampled_gamma, sampled=True)}
    secs = {t: r.compile_seconds if r is not None else 0.0 for t, r in rounds.items()}
    gammas = sorted({gamma, sampled_gamma})
    compiled = all(g + 1 in fast.compiled_token_counts for g in gammas) and 2 in fast_draft.compiled_token_counts
    verify_note = ", ".join(f"{g + 1}-token verify graph {fast.compile_seconds_by_tokens.get(g + 1, 0):.0f} s"
                            for g in gammas)

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
        td, t1 = time_interleaved([lambda: fast_draft.forward(tokens[1], positions[1]), step(1)], target.device,
                                  **warm)
        # and a whole round as one graph (gamma draft steps inside it, then the verify pass), where it compiled
        round_costs = {}
        for temperature, g in ((0.0, gamma), (1.0, sampled_gamma)):
            run = fused_round_call(fast, fast_draft, g, T0, sampled=temperature > 0)
            if run is not None:
                tr, ts = time_interleaved([run, step(1)], target.device, **warm)
                round_costs[temperature] = median(tr) / median(ts)
    v = {g: median(tv) / median(t) for g, (tv, t) in verify_times.items()}
    c = median(td) / median(t1)

    rows, stats = [], {}
    variants = [("greedy", 0.0, gamma, True, 2.0), ("greedy, models called one at a time", 0.0, gamma, False, None),
                ("T=1", 1.0, sampled_gamma, True, 1.3),
                ("T=1, models called one at a time", 1.0, sampled_gamma, False, None)]
    if fused_only:
        variants = [v for v in variants if v[3]]
    for name, temperature, g, fuse, target_ratio in variants:
        tb, tc, same = [], [], True
        plain = partial(fast.generate, max_new_tokens=n_new, temperature=temperature)
        spec = partial(speculative_generate, fast, fast_draft, max_new_tokens=n_new, gamma=g, temperature=temperature,
                       fuse_rounds=fuse)
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
        progress()
        pairs = [sum(tb[i:i + len(prompts)]) / sum(tc[i:i + len(prompts)]) for i in range(0, len(tb), len(prompts))]
        st = stats[name]
        e = st.tokens_per_target_call
        model_bound, free_verify = e / (v[g] + g * c), e / (1 + g * c)
        R = round_costs.get(temperature) if fuse else None  # the round graph, in target steps
        # what the round graph allows, and with every proposal accepted: what no draft of this cost can beat
        round_bound, all_accepted = (e / R, (g + 1) / R) if R else (None, None)
        note = (f"gamma {g}, alpha {st.acceptance_rate:.2f}, {e:.2f} tokens/target call, v {v[g]:.2f}; the costs "
                f"allow {model_bound:.2f}x, {free_verify:.2f}x with v = 1"
                + (f"; a round graph costs {R:.2f} steps: {round_bound:.2f}x, {all_accepted:.2f}x accepting every "
                   "proposal" if R else "")
                + (", distribution: tests/test_speculative.py" if temperature else "")
                + f"; {compile_note(temperature)}")
        rows.append(Row(f"speculative compiled{label}, draft model, {name} vs plain compiled{label}", "plain compiled",
                        "speculative compiled", pairs, f"{n_new * len(tb) / sum(tb):.0f} tok/s",
                        f"{n_new * len(tc) / sum(tc):.0f} tok/s", target=target_ratio,
                        same_output=same if temperature == 0 else None, note=note,
                        extra={"alpha": st.acceptance_rate, "tokens_per_target_call": e, "gamma": g,
                               "compile_seconds": secs[temperature], "fused_rounds": fuse,
                               "cost_model_bound": model_bound, "bound_with_free_verify": free_verify,
                               "round_graph_steps": R, "round_graph_bound": round_bound,
                               "bound_accepting_every_proposal": all_accepted}))
    for g in gammas:
        tv, t = verify_times[g]
        rows.append(Row(f"compiled{label}: cost of a {g + 1}-token verify pass / 1 step", f"{g + 1} tokens", "1 token",
                        _ratios(tv, t), f"{median(tv) * 1e3:.2f} ms", f"{median(t) * 1e3:.2f} ms",
                        note=f"speculation pays when this is near 1; a draft step costs {c:.2f} target steps",
                        extra={"draft_step_over_target_step": c}))
    return rows


def rows_compile_levers(model, tok, n_new: int, repeats: int, fast, progress, tuned=None) -> list[Row]:
    """What each lever of the compiled step buys, each against the plain compiled step (buffer sized to
    the generation) in the same run: a buffer of the whole context window, the default CPU choices undone
    one at a time (generated Python driving the kernels in place of C++, the weights passed in as inputs
    in place of frozen constants, nn.Linear's weight layout, torch's SDPA in place of fused attention),
    `tuned` (the opt-in gemm_autotune step, if given), and the share of a generation that the (eager)
    prefill takes: compiling prefill can save at most that."""
    from .fast_decode import FastGenerator
    from .generate import prefill
    from .kv_cache import KVCache

    prompt = torch.tensor([tok.encode("def main():\n", bos=True)], device=model.device)
    S = fast.cache.max_seq_len

    def plain():
        return fast.generate(prompt, n_new)

    ref = plain()
    rows = []
    window = model.cfg.max_seq_len
    levers = [(f"buffer {window} (whole window)", FastGenerator(model, max_seq_len=window))]
    if fast.cpp_wrapper:  # what the C++ wrapper buys: the same step driven by inductor's generated Python
        levers.append(("Python wrapper in place of C++", FastGenerator(model, max_seq_len=S, cpp_wrapper=False)))
    if fast.freeze:  # what freezing buys: the same step taking its weights as inputs every call
        levers.append(("weights as inputs, not frozen", FastGenerator(model, max_seq_len=S, freeze=False)))
    if fast.input_major:  # what the default layout buys: the same step with nn.Linear's (out, in) weights
        levers.append(("(out, in) weights, nn.Linear's layout", FastGenerator(model, max_seq_len=S, input_major=False)))
    if fast.static_attention == "sums":  # what the fused attention buys: the same step calling torch's SDPA
        levers.append(("SDPA in place of fused attention",
                       FastGenerator(model, max_seq_len=S, static_attention="sdpa")))
    if tuned is not None:  # the opt-in lever: inductor's own GEMM on prepacked weights, autotuned per product
        levers.append(("inductor's autotuned GEMM (gemm_autotune)", tuned))
    for label, cand in levers:
        secs = cand.warmup()
        same = torch.equal(cand.generate(prompt, n_new), ref)
        tb, tc = time_interleaved([plain, lambda cand=cand: cand.generate(prompt, n_new)], model.device, repeats)
        progress()
        rows.append(Row(f"compiled: {label} vs buffer {S}", f"buffer {S}", label, _ratios(tb, tc),
                        f"{median(tb) / n_new * 1e3:.2f} ms/token",
                        f"{median(tc) / n_new * 1e3:.2f} ms/token", same_output=same,
                        note=f"{cand.compile_source} in {secs:.0f} s"))
    cache = KVCache.for_model(model, max_seq_len=S)
    tp, tg = time_interleaved([lambda: prefill(model, prompt, cache), plain], model.device, repeats)
    rows.append(Row(f"eager prefill ({prompt.shape[1]} tokens) / compiled generation", "generation", "prefill",
                    [p / g for p, g in zip(tp, tg)], f"{median(tg) * 1e3:.0f} ms",
                    f"{median(tp) * 1e3:.2f} ms",
                    note="fraction, not speedup: the most that compiling prefill could save"))
    return rows


def row_compiled_vs_limit(model, tok, n_new: int, repeats: int, fast, progress, label: str = "compiled step") -> Row:
    """The compiled step against the roofline ceiling for this model on this machine: max(bytes per token /
    measured copy bandwidth, FLOPs per token / measured peak). Ratio = ceiling / measured (1 = at the limit)."""
    from .measure.flops import forward_bytes, forward_flops
    from .measure.roofline import measure_copy_bandwidth, measure_matmul_flops, roofline_time

    cfg, device = model.cfg, model.device
    elem = model.embed.weight.element_size()
    prompt = torch.tensor([tok.encode("def main():\n", bos=True)], device=device)
    n_past = prompt.shape[1] + n_new // 2  # the average position of a generated token
    step_bytes = forward_bytes(cfg, 1, n_past, bytes_per_weight=elem, bytes_per_kv=elem)
    step_flops = forward_flops(cfg, 1, n_past)
    ratios, measured, limits = [], [], []
    for _ in range(repeats):
        bw = measure_copy_bandwidth(device).per_second
        peak = measure_matmul_flops(device, repeats=3).per_second
        per_token = timed(lambda: fast.generate(prompt, n_new), device)[0] / n_new
        limit = roofline_time(step_flops, step_bytes, peak, bw)
        ratios.append(limit / per_token)
        measured.append(per_token)
        limits.append(limit)
    progress()
    note = f"{step_bytes / 1e6:.1f} MB/token; fraction of the limit reached"
    if median(ratios) > 1:  # the copy bandwidth is main memory's; these weights did not come from it
        note += " (above 1: the weights stayed in the CPU's caches, faster than main memory)"
    return Row(f"{label} vs its roofline ceiling", "ceiling", "compiled", ratios,
               f"{median(limits) * 1e3:.2f} ms ceiling", f"{median(measured) * 1e3:.2f} ms/token",
               target=round(1 / 1.5, 2), note=note)


def rows_precision(model, big, repeats: int, progress) -> list[Row]:
    """bf16 weights and activations against fp32, batch-1 eager decode step, on the course model and on the
    memory-bound random-weight model (the quality change is measured in chapter 07)."""
    import copy

    rows = []
    if model.dtype != torch.float32:
        return rows
    for label, m in [("course model", model), (f"{big.num_parameters() / 1e6:.0f}M random weights", big)]:
        low = copy.deepcopy(m).to(torch.bfloat16)
        tb, tc = [], []
        for _ in range(repeats):
            tb.append(decode_step_seconds(m))
            tc.append(decode_step_seconds(low))
        progress()
        rows.append(Row(f"bf16 vs fp32 decode step, {label}", "fp32", "bf16", _ratios(tb, tc),
                        f"{median(tb) * 1e3:.2f} ms", f"{median(tc) * 1e3:.2f} ms",
                        note=f"CPU capability {torch.backends.cpu.get_cpu_capability()}: the kernels decide"))
        del low
    return rows


def rows_precision_compiled(model, big, repeats: int, progress) -> list[Row]:
    """16-bit weights with float32 arithmetic (quantize.py's "bf16" / "fp16", the fused_dequant loop) in the
    compiled batch-1 step, against the float32 compiled step, on the course model and the memory-bound
    random-weight model. Target: faster than float32 (the bytes read per step halve)."""
    from .fast_decode import FastGenerator
    from .quantize import quantize_model

    rows = []
    if model.dtype != torch.float32:
        return rows
    n_steps, context = 16, 16
    S = context + n_steps + 1
    for label, m in [("course model", model), (f"{big.num_parameters() / 1e6:.0f}M random weights", big)]:
        base = FastGenerator(m, max_seq_len=S)
        base.warmup()
        for method in ("bf16", "fp16"):
            qm = quantize_model(m, method)
            tb, tc, secs, source = _time_against_compiled(base, qm, repeats, n_steps, context)
            bound = decode_byte_ratio(m, qm, context + n_steps // 2)
            rows.append(Row(f"{method} weights, fp32 arithmetic, compiled vs fp32 compiled, {label}", "fp32 compiled",
                            f"{method} weights", _ratios(tb, tc), f"{median(tb) * 1e3:.2f} ms",
                            f"{median(tc) * 1e3:.2f} ms", target=1.0,
                            note=f"byte ratio {bound:.2f}x; {source} in {secs:.0f} s"))
            del qm
        progress()
    return rows


def rows_llama_cpp(model, tok, n_new: int, repeats: int, fast, progress, label: str = "helpers compiled step",
                   file_types=("f32", "f16")) -> tuple[list[Row], str]:
    """llama.cpp (through llama-cpp-python) on the same weights exported to GGUF (f32, f16), against the
    compiled step `fast`; same prompt, same number of greedy tokens, same thread count."""
    try:
        import llama_cpp
    except ImportError:
        return [], "llama.cpp rows skipped: llama-cpp-python is not installed (pip install llama-cpp-python)"
    import copy
    import tempfile
    from pathlib import Path

    from .export_gguf import write_gguf

    prompt_ids = tok.encode("def main():\n", bos=True)
    prompt = torch.tensor([prompt_ids], device=model.device)
    rows = []
    cpu_model = model if model.device.type == "cpu" else copy.deepcopy(model).to("cpu", torch.float32)
    with tempfile.TemporaryDirectory() as tmp:
        for file_type in file_types:
            path = write_gguf(cpu_model, tok, Path(tmp) / f"target-{file_type}.gguf", file_type)
            # a float32 KV cache like ours (llama.cpp's default is float16)
            llm = llama_cpp.Llama(model_path=str(path), n_ctx=len(prompt_ids) + n_new + 8,
                                  n_threads=torch.get_num_threads(), n_threads_batch=torch.get_num_threads(),
                                  type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, verbose=False)

            def theirs(llm=llm):
                out = []
                for t in llm.generate(prompt_ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
                    out.append(t)
                    if len(out) == n_new:
                        break
                return out

            same = theirs() == fast.generate(prompt, n_new)[0, len(prompt_ids):].tolist()
            tb, tc = time_interleaved([theirs, lambda: fast.generate(prompt, n_new)], model.device, repeats)
            progress()
            rows.append(Row(f"{label} vs llama.cpp {file_type}", f"llama.cpp {file_type}",
                            "compiled step", _ratios(tb, tc), f"{n_new / median(tb):.0f} tok/s",
                            f"{n_new / median(tc):.0f} tok/s",
                            target=round(1 / 1.5, 2) if file_type == "f32" else None,
                            same_output=same,
                            note=f"llama-cpp-python {llama_cpp.__version__}, same weights, f32 KV cache"))
            del llm
    return rows, ""


# ---- report -----------------------------------------------------------------------------------
def plot(rows: list[Row], curves: dict | None, device_name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .course.plotting import save_figure, use_course_style

    use_course_style()
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.5))
    names = [r.name for r in rows][::-1]
    meds = [r.median for r in rows][::-1]
    err = [[r.median - min(r.ratios) for r in rows][::-1], [max(r.ratios) - r.median for r in rows][::-1]]
    ax.barh(names, meds, xerr=err, color="tab:blue", alpha=0.8)
    for i, r in enumerate(rows[::-1]):
        if r.target is not None:
            ax.plot([r.target, r.target], [i - 0.4, i + 0.4], color="tab:red", lw=2)
    ax.set_xscale("log")
    ax.set(xlabel="ratio (median, min-max); red: the course's target", title=f"helpers.bench on {device_name}")
    save_figure(fig, "bench_summary", show=False)
    if curves:
        fig, ax = plt.subplots()
        for label, ys in curves.items():
            ax.plot(range(1, len(ys) + 1), [y * 1e3 for y in ys], label=label)
        ax.set(yscale="log", xlabel="generated token", ylabel="ms per token (median)",
               title=f"Per-token time with and without the KV cache ({device_name})")
        ax.legend()
        save_figure(fig, "bench_cache_latency", show=False)


def device_description(device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="about a minute: shorter runs, fewer repeats")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    ap.add_argument("--big-preset", default="bench-150m", help="random-weight config for the memory-bound rows")
    args = ap.parse_args(argv)
    from .checkpoint import load_model
    from .fast_decode import FastGenerator
    from .progress import progress_bar

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device) if args.device else default_device()
    dtype = default_dtype(device)
    name = device_description(device)
    quick = args.quick
    repeats = 3 if quick else 5
    n_cache = 256 if quick else 1024
    cache_repeats = 1 if quick else 3
    n_spec = 64 if quick else 128
    n_hf = 128 if quick else 256
    model, tok = load_model("target", device=device, dtype=dtype)
    draft, _ = load_model("draft", device=device, dtype=dtype)
    big = random_model(args.big_preset, device, dtype)

    n_quant = (3 if device.type == "cpu" else 2) + (0 if args.no_compile else 4 + 2)  # + rows_precision_compiled
    tuned_steps = 5 if device.type == "cpu" else 0  # the autotuned step's lever, roofline, llama.cpp, 2 rounds
    steps = (0 if args.no_compile else 1 + 5 + 1 + 2 + 4 + tuned_steps) + cache_repeats + \
        (1 if args.no_compile else 2) + 2 + 3 + \
        n_quant + repeats
    bar = progress_bar(total=steps, desc="bench", unit="run")
    fast = None
    compile_note = "compile skipped"
    if not args.no_compile:
        # the static step attends over its whole cache buffer every step, so size the buffer to the
        # generation (prompt + new tokens), as a server sizes it to the request: 1024 would cost ~2x
        fast = FastGenerator(model, max_seq_len=n_hf + 64)
        secs = fast.warmup()
        compile_note = f"compile {secs:.0f} s" if fast.compiled else "compile unavailable: eager fallback"
        bar.update(1)
    # the opt-in step: frozen weights prepacked, inductor's own GEMM timed against the library's per product
    tuned = None
    if fast is not None and fast.freeze:
        tuned = FastGenerator(model, max_seq_len=n_hf + 64, gemm_autotune=True)
    rows = []
    row, curves = row_cache_vs_recompute(model, tok, n_cache, cache_repeats, lambda: bar.update(1))
    rows.append(row)
    rows += row_vs_transformers(model, tok, n_hf, repeats, fast, lambda: bar.update(1))
    llama_note = ""
    if fast is not None:
        rows += rows_compile_levers(model, tok, n_hf, repeats, fast, lambda: bar.update(1), tuned=tuned)
        rows.append(row_compiled_vs_limit(model, tok, n_hf, repeats, fast, lambda: bar.update(1)))
        if tuned is not None:
            rows.append(row_compiled_vs_limit(model, tok, n_hf, repeats, tuned, lambda: bar.update(1),
                                              label="compiled step, autotuned GEMM"))
        llama_rows, llama_note = rows_llama_cpp(model, tok, n_hf, repeats, fast, lambda: bar.update(1))
        rows += llama_rows
        if tuned is not None and llama_rows:
            rows += rows_llama_cpp(model, tok, n_hf, repeats, tuned, lambda: bar.update(1),
                                   label="compiled step, autotuned GEMM", file_types=("f32",))[0]
    rows += rows_precision(model, big, 3 if quick else 5, lambda: bar.update(1))
    if fast is not None:
        rows += rows_precision_compiled(model, big, 3 if quick else 5, lambda: bar.update(1))
    rows += rows_speculative(model, draft, tok, n_spec, 2 if quick else 3, lambda: bar.update(1))
    if fast is not None:  # the same prompts, compiled draft and verify steps against the compiled plain loop
        rows += rows_speculative_compiled(model, draft, tok, n_spec, 2 if quick else 3, fast, lambda: bar.update(1))
        if tuned is not None:  # the same rounds on autotuned generators, against the autotuned plain step
            rows += rows_speculative_compiled(model, draft, tok, n_spec, 2 if quick else 3, tuned,
                                              lambda: bar.update(1), label=" (autotuned GEMM)", fused_only=True)
    rows += rows_quantized(big, 3 if quick else 5, lambda: bar.update(1))
    if fast is not None:
        rows += rows_quantized_compiled(big, 3 if quick else 5, lambda: bar.update(1))
    rows.append(row_decode_bandwidth(big, repeats, lambda: bar.update(1)))
    from .serving.bench import serving_rows  # chapter 13's targets: many requests at once

    rows += [Row(**d) for d in serving_rows(model, tok, quick)]
    bar.close()
    quality = quantized_quality(model, tok, n_windows=4 if quick else 12)

    print(f"\nhelpers.bench on {name}, torch {torch.__version__}, dtype {dtype}, {compile_note}"
          f"{' (quick)' if quick else ''}")
    print(f"{'row':46s} {'ratio':>7s} {'[min-max]':11s} {'baseline':>16s} -> {'candidate':<16s} target")
    for r in rows:
        print(r.line())
    print(f"quantization quality, {quality}")
    if llama_note:
        print(llama_note)
    figures = figures_dir()
    figures.mkdir(parents=True, exist_ok=True)
    plot(rows, curves, name)
    results = {"device": name, "torch": torch.__version__, "dtype": str(dtype), "quick": quick,
               "compile": compile_note, "quantization_quality": quality,
               "rows": [asdict(r) | {"median": r.median} for r in rows]}
    (figures / "bench_results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {figures / 'bench_summary.png'}, bench_cache_latency.png, bench_results.json")


if __name__ == "__main__":
    main()
