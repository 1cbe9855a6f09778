"""The static-shape decode path and the compiled FastGenerator against the plain eager loop."""

from __future__ import annotations

import copy
from functools import partial

import pytest
import torch
from conftest import random_model

from helpers import fast_decode
from helpers.fast_decode import FastGenerator, compile_available
from helpers.generate import decode_one_token, generate, prefill, prefill_by_steps
from helpers.kv_cache import KVCache
from helpers.model import Linear, ModelConfig, attention_as_sums
from helpers.paths import INDUCTOR_CACHE, REPO
from helpers.row_sums import RowSumLinear

CFG = ModelConfig.from_preset("tiny", max_seq_len=256)


@pytest.fixture(scope="module")
def model():
    return random_model(CFG, seed=11)


def test_static_path_matches_dynamic_path(model):
    idx = torch.randint(0, CFG.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    cache = KVCache.for_model(model)
    with torch.no_grad():
        full = model(idx)  # (1, 40, V)
        prefill(model, idx[:, :8], cache)
        steps = [
            model(idx[:, t : t + 1], cache=cache, input_pos=torch.tensor([t]), check=False)[:, -1] for t in range(8, 40)
        ]
        # several tokens at once through the static path too (speculative verification shape)
        multi = model(idx[:, 20:24], cache=cache, input_pos=torch.arange(20, 24), check=False)
    assert torch.allclose(torch.stack(steps, 1), full[:, 8:], atol=1e-5, rtol=0)
    assert torch.allclose(multi, full[:, 20:24], atol=1e-5, rtol=0)


def test_prefill_by_steps_equals_prefill(model):
    """The prompt one token at a time through a decode step gives prefill's logits and cache length; generate
    takes it as its prefill, and refuses a prefill that is not callable, naming it."""
    prompt = torch.randint(0, CFG.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    a, b = KVCache.for_model(model, batch_size=2), KVCache.for_model(model, batch_size=2)
    with torch.no_grad():
        expected = prefill(model, prompt, a)  # (2, V)
        got = prefill_by_steps(model, prompt, b, decode_one_token)
    assert b.length == a.length == 7
    assert torch.allclose(got, expected, atol=1e-5, rtol=0)
    assert torch.allclose(b.k[:, :, :, :7], a.k[:, :, :, :7], atol=1e-5, rtol=0)
    by_steps = partial(prefill_by_steps, step=decode_one_token)
    with torch.no_grad():
        assert torch.equal(generate(model, prompt, 20, prefill=by_steps), generate(model, prompt, 20))
    with pytest.raises(ValueError, match="prefill must be a callable"):
        generate(model, prompt, 3, prefill=5)
    with pytest.raises(ValueError, match="at least one token"):
        prefill_by_steps(model, prompt[:, :0], b, decode_one_token)


def test_eager_fast_generator_equals_generate(model):
    prompt = [1, 2, 3, 4]
    fast = FastGenerator(model, compile=False)
    for n in (1, 50, 200):
        assert torch.equal(fast.generate(prompt, n), generate(model, prompt, n))
    # sampling with the same generator seed draws the same tokens
    a = fast.generate(prompt, 60, temperature=0.9, generator=torch.Generator().manual_seed(3))
    b = generate(model, prompt, 60, temperature=0.9, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


def test_fast_generator_runs_generates_loop_with_its_processors_and_stops(model):
    """FastGenerator.generate is helpers.generate's loop on its own step: logits processors, stop criteria
    and stop sequences act the same, and the cache ends where the eager loop's would."""
    prompt, banned = [1, 2, 3, 4], int(generate(model, [1, 2, 3, 4], 1)[0, -1])

    def ban(ids, logits):  # (B, T) ids so far, (B, V) logits
        return logits.index_fill(-1, torch.tensor([banned]), float("-inf"))

    fast = FastGenerator(model, compile=False)
    out = fast.generate(prompt, 40, logits_processors=[ban])
    assert torch.equal(out, generate(model, prompt, 40, logits_processors=[ban]))
    assert banned not in out[0, len(prompt) :].tolist()
    assert fast.cache.length == len(prompt) + 40 - 1  # every token but the last was fed back
    ref = generate(model, prompt, 40)
    stop_at = ref[0, len(prompt) + 5 : len(prompt) + 7].tolist()
    for kwargs in ({"stop_criteria": [lambda ids: len(ids) == 9]}, {"stop_sequences": [stop_at]}):
        assert torch.equal(fast.generate(prompt, 40, **kwargs), generate(model, prompt, 40, **kwargs)), kwargs
    with pytest.raises(ValueError, match="logits_processors"):
        fast.generate(prompt, 5, logits_processors=ban)


@pytest.mark.skipif(not compile_available(), reason="torch.compile needs a C++ compiler on the CPU")
def test_compiled_fast_generator_equals_generate(model):
    fast = FastGenerator(model, compile=True)
    seconds = fast.warmup()
    assert fast.compiled and seconds > 0
    prompt = [5, 6, 7]
    assert torch.equal(fast.generate(prompt, 120), generate(model, prompt, 120))
    assert torch.equal(
        fast.generate(prompt, 30, eos_id=int(generate(model, prompt, 30)[0, 10])),
        generate(model, prompt, 30, eos_id=int(generate(model, prompt, 30)[0, 10])),
    )


def test_compile_failure_falls_back_to_eager(model, compile_fails):
    fast = FastGenerator(model, compile=True)
    with pytest.warns(UserWarning, match="torch.compile failed"):
        fast.warmup()
    assert not fast.compiled
    assert torch.equal(fast.generate([1, 2], 20), generate(model, [1, 2], 20))


def test_fast_generator_rejects_bad_input(model):
    fast = FastGenerator(model, max_seq_len=32, compile=False)
    with pytest.raises(ValueError, match="exceeds this generator's max_seq_len=32"):
        fast.generate([1] * 20, 20)
    with pytest.raises(ValueError, match="does not apply penalties"):
        from helpers.sampling import SamplingConfig

        fast.generate([1], 5, sampling=SamplingConfig(repetition_penalty=1.2))
    with pytest.raises(ValueError, match="prompt must contain at least 1 token"):
        fast.generate([], 5)
    with pytest.raises(ValueError, match="static_attention must be 'sdpa' or 'sums'"):
        FastGenerator(model, compile=False, static_attention="flash")


@pytest.mark.cuda
def test_cuda_graph_decode_equals_eager_on_gpu():
    model = random_model(CFG, seed=12).to("cuda", torch.bfloat16)
    fast = FastGenerator(model)  # mode="reduce-overhead": the step is captured as a CUDA graph
    fast.warmup()
    assert fast.compiled
    prompt = [3, 1, 4, 1, 5]
    eager = FastGenerator(model, compile=False).generate(prompt, 100)
    assert torch.equal(fast.generate(prompt, 100), eager)
    assert torch.equal(fast.generate(prompt, 100), eager)  # replays reuse the cache correctly


@pytest.mark.skipif(not compile_available(), reason="torch.compile needs a C++ compiler on the CPU")
def test_compile_source_and_public_step(model):
    first = FastGenerator(model, max_seq_len=64)
    first.warmup()
    assert first.compile_source in ("compiled cold", "compiled from the on-disk cache")
    if first.compile_source == "compiled cold":
        assert first.cold_compile_seconds == round(first.compile_seconds, 1)
    again = FastGenerator(model, max_seq_len=64)  # the same shapes: the generated code is found in the cache
    again.warmup()
    assert again.compile_source == "compiled from the on-disk cache"
    assert again.cold_compile_seconds == first.cold_compile_seconds  # one record per step's shapes
    # the public step: the same logits as the eager static path, to float rounding
    idx = torch.randint(0, CFG.vocab_size, (1, 12), generator=torch.Generator().manual_seed(1))
    eager = FastGenerator(model, max_seq_len=64, compile=False)
    fresh = FastGenerator(model, max_seq_len=64)  # not warmed up yet: step() compiles first
    for gen in (again, eager, fresh):
        prefill(model, idx[:, :8], gen.cache)
    with torch.no_grad():
        full = model(idx)[0]  # (12, V)
    for t in range(8, 12):
        pos = torch.tensor([t])
        for gen in (again, eager, fresh):  # warming up inside step() must not disturb the prefilled cache
            assert torch.allclose(gen.step(idx[:, t : t + 1], pos)[0], full[t], atol=1e-5, rtol=0)
    assert not eager.compiled and fresh.compiled


def test_not_compiled_says_why(model, monkeypatch):
    assert FastGenerator(model, compile=False).compile_source == "not compiled (compile=False)"
    monkeypatch.setattr(fast_decode, "compile_available", lambda: False)
    with pytest.warns(UserWarning, match="no C\\+\\+ compiler|none was found"):
        fast = FastGenerator(model, compile=True)
    assert fast.compile_source.startswith("not compiled: no C++ compiler")
    assert torch.equal(fast.generate([1, 2], 10), generate(model, [1, 2], 10))


def test_input_major_copy_shares_all_but_the_projections(model):
    twin = fast_decode.input_major_copy(model)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and not any(isinstance(m, torch.nn.Linear) for m in twin.modules())  # all swapped in the copy
    assert all(type(m) is Linear for m in linears)  # the original is untouched
    assert twin.embed.weight.data_ptr() == model.embed.weight.data_ptr()  # shared, not copied
    assert twin.layers[0].attn_norm.weight.data_ptr() == model.layers[0].attn_norm.weight.data_ptr()
    assert twin.rope_cos.data_ptr() == model.rope_cos.data_ptr()
    wt = twin.layers[0].mlp.w_down.weight_t
    assert wt.is_contiguous() and torch.equal(wt, model.layers[0].mlp.w_down.weight.t())
    assert twin.layers[0].mlp.w_down.weight is model.layers[0].mlp.w_down.weight  # (out, in), for several rows
    idx = torch.randint(0, CFG.vocab_size, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(twin(idx), model(idx), atol=1e-5, rtol=0)  # same products, another summation order
        one = idx[:1, :1]  # a single row: the (in, out) copy
        assert torch.allclose(twin(one), model(one), atol=1e-5, rtol=0)


def test_input_major_on_or_off_gives_the_tokens_of_generate(model):
    prompt = [3, 1, 4, 1, 5]
    ref = generate(model, prompt, 80)
    for input_major in (True, False):
        fast = FastGenerator(model, compile=False, input_major=input_major)
        assert fast.input_major is input_major
        assert torch.equal(fast.generate(prompt, 80), ref)
    default = FastGenerator(model, compile=False)
    assert default.gemv == "sums" and not default.input_major  # the default on a CPU: nn.Linear's own weights
    assert FastGenerator(model, compile=False, gemv="library").input_major  # torch's kernel: the (in, out) copy


@pytest.mark.skipif(not compile_available(), reason="torch.compile needs a C++ compiler on the CPU")
def test_forward_compiles_the_warmed_token_counts_only(model):
    fast = FastGenerator(model, max_seq_len=64)
    fast.warmup(token_counts=(4,))
    assert fast.compiled_token_counts == (1, 4) and set(fast.compile_seconds_by_tokens) == {1, 4}
    seconds = fast.compile_seconds
    idx = torch.randint(0, CFG.vocab_size, (1, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(idx)[0]  # (20, V)
        prefill(model, idx[:, :8], fast.cache)
        four = fast.forward(idx[:, 8:12], torch.arange(8, 12))[0]  # compiled (a strided view of idx: copied)
        three = fast.forward(idx[:, 12:15], torch.arange(12, 15))[0]  # not warmed up: the eager static path
    assert torch.allclose(four, full[8:12], atol=1e-5, rtol=0)
    assert torch.allclose(three, full[12:15], atol=1e-5, rtol=0)
    assert fast.compile_seconds == seconds  # nothing compiled on the way
    with pytest.raises(ValueError, match="token_counts"):
        fast.warmup(token_counts=(65,))


@pytest.mark.skipif(not compile_available(), reason="torch.compile needs a C++ compiler on the CPU")
def test_many_generators_in_one_process_all_compile(model):
    # every generator compiles the same methods: dynamo's default limit of 8 graphs per code object
    # made the ninth generator fall back to eager (FailOnRecompileLimitHit)
    prompt = [1, 2, 3]
    ref = generate(model, prompt, 5)
    gens = [FastGenerator(model, max_seq_len=8 + i) for i in range(9)]
    for g in gens:
        g.warmup()
    assert all(g.compiled for g in gens), [g.compile_source for g in gens]
    assert all(torch.equal(g.generate(prompt, 5), ref) for g in gens)


@pytest.mark.parametrize("H, Hkv, T", [(8, 2, 1), (8, 2, 4), (4, 4, 3), (6, 1, 2)])
def test_attention_as_sums_matches_sdpa(H, Hkv, T):
    g = torch.Generator().manual_seed(H * 10 + Hkv + T)
    B, S, D = 2, 24, 16
    q = torch.randn(B, H, T, D, generator=g)
    k, v = torch.randn(B, Hkv, S, D, generator=g), torch.randn(B, Hkv, S, D, generator=g)
    pos = torch.arange(10, 10 + T)  # queries at positions 10.., each sees keys 0..its position
    mask = torch.arange(S) <= pos.unsqueeze(1)  # (T, S)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=Hkv != H)
    assert torch.allclose(attention_as_sums(q, k, v, mask), ref, atol=1e-5, rtol=0)


@pytest.mark.skipif(not compile_available(), reason="torch.compile needs a C++ compiler on the CPU")
def test_compiled_cpu_step_attends_without_torchs_attention_kernel(model):
    from helpers.measure.profiling import profile_step

    prompt = [2, 7, 1, 8]
    ref = generate(model, prompt, 40)
    ops = {}
    for attention in ("sums", "sdpa"):
        # the generated Python caller: the C++ one (the CPU default) calls the kernels past the profiler
        # torch's matrix-vector kernel (gemv="library"), to see that InputMajorLinear copies no activation
        fast = FastGenerator(model, max_seq_len=64, static_attention=attention, cpp_wrapper=False, gemv="library")
        assert torch.equal(fast.generate(prompt, 40), ref) and fast.compiled
        step = partial(fast.step, torch.tensor([[3]]), torch.tensor([50]))
        ops[attention] = set(profile_step(step, steps=2).ops)
    assert FastGenerator(model, compile=False).static_attention == "sums"  # the default on a CPU
    assert not any("scaled_dot_product" in name for name in ops["sums"])  # fused into inductor's loop
    assert any("scaled_dot_product" in name for name in ops["sdpa"])
    # and no activation is copied before its matmul (InputMajorLinear hands over plain-strided rows)
    assert "aten::clone" not in ops["sums"] and "aten::copy_" not in ops["sums"]


@pytest.mark.parametrize("capability", ["avx2", "default"])
def test_inductor_cache_is_kept_per_instruction_set(capability):
    # a cache filled under AVX-512 and read under another ATEN_CPU_CAPABILITY gave NaN logits (avx2) or a
    # failed build (default): each instruction set gets its own folder
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"} | {"ATEN_CPU_CAPABILITY": capability}
    out = subprocess.run(
        [sys.executable, "-c", "from helpers.fast_decode import inductor_cache_dir as d; print(d())"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    folder = out.stdout.strip()
    assert os.path.basename(folder) == capability
    assert os.path.dirname(folder) == str(INDUCTOR_CACHE)


@pytest.mark.skipif(not compile_available(), reason="torch.compile needs a C++ compiler on the CPU")
def test_compiled_batch_of_two_equals_generate(model):
    # two rows through the compiled step: the fused attention's batch dimension and InputMajorLinear's
    # plain-strided rows (B*T = 2) must keep the rows apart
    prompt = torch.tensor([[5, 6, 7, 8], [9, 1, 2, 3]])
    fast = FastGenerator(model, batch_size=2, max_seq_len=64)
    out = fast.generate(prompt, 30)
    assert fast.compiled
    assert torch.equal(out, generate(model, prompt, 30))
    assert torch.equal(out[1:], generate(model, prompt[1:], 30))  # row 1 alone: the same tokens


def test_cpu_defaults_freeze_float_and_fused_dequant_weights(model):
    from helpers.quantize import quantize_model

    fast = FastGenerator(model, compile=False)
    assert fast.cpp_wrapper and fast.freeze  # the defaults on a CPU
    # torch's int8 kernel (int8pack, int8's default on a CPU) keeps its weights as inputs
    assert not FastGenerator(quantize_model(model, "int8"), compile=False).freeze
    # "fused_dequant" layers (bf16's default) are frozen, their conversions kept out of constant folding
    # (test_quantize.py's test_frozen_step_reads_the_codes); so is a model all in bf16
    assert FastGenerator(quantize_model(model, "bf16"), compile=False).freeze
    assert FastGenerator(quantize_model(model, "int8", kernel="fused_dequant"), compile=False).freeze
    assert FastGenerator(copy.deepcopy(model).to(torch.bfloat16), compile=False).freeze
    assert not FastGenerator(model, compile=False, freeze=False, cpp_wrapper=False).freeze


@pytest.mark.skipif(not compile_available(), reason="torch.compile needs a C++ compiler on the CPU")
def test_frozen_weights_are_constants_of_the_compiled_step(model):
    from torch._inductor.freezing_utils import is_frozen_param

    fast = FastGenerator(model, max_seq_len=48)
    fast.warmup()
    assert fast.compiled
    # what the one-row step reads: each layer's panel copy (row_sums.py), else its own weight
    layers = [m for m in fast.decode_model.modules() if isinstance(m, RowSumLinear)]
    step_weights = [m.weight if m.panels is None else m.panels for m in layers]
    step_weights += [fast.decode_model.embed.weight, fast.decode_model.norm.weight]
    assert len(step_weights) > 2 and all(is_frozen_param(w) for w in step_weights)  # constants, not inputs
    plain = FastGenerator(model, max_seq_len=48, freeze=False, gemv="library")
    plain.warmup()
    own = [m.weight_t for m in plain.decode_model.modules() if isinstance(m, fast_decode.InputMajorLinear)]
    assert own and not any(is_frozen_param(w) for w in own)  # its own (in, out) copies: inputs of every step
    prompt = [3, 1, 4, 1, 5]
    assert torch.equal(fast.generate(prompt, 40), plain.generate(prompt, 40))


@pytest.mark.skipif(not compile_available(), reason="torch.compile needs a C++ compiler on the CPU")
def test_autotuned_gemm_step_gives_the_tokens_and_logits_of_the_library_step(model):
    """gemm_autotune (opt-in): the frozen weights prepacked and each product timed as inductor's own C++ GEMM
    against the library's call; whichever wins, the step's tokens are generate's and its logits those of
    the eager step to float rounding. It needs frozen weights, and says so."""
    with pytest.raises(ValueError, match="freeze"):
        FastGenerator(model, compile=False, freeze=False, gemm_autotune=True)
    assert not FastGenerator(model, compile=False).gemm_autotune  # opt-in
    tuned = FastGenerator(model, max_seq_len=48, gemm_autotune=True)
    assert tuned.warmup() > 0 and tuned.compiled and tuned.freeze
    assert tuned.compile_key() != FastGenerator(model, max_seq_len=48).compile_key()
    for prompt in ([3, 1, 4, 1, 5], [9]):
        assert torch.equal(tuned.generate(prompt, 40), generate(model, prompt, 40))
    assert_step_logits_match_eager(tuned, model)


def assert_step_logits_match_eager(fast, model):
    """The compiled step's logits after a short prompt are the eager model's, to float rounding."""
    with torch.no_grad():
        fast.cache.reset()
        cache = KVCache.for_model(model, max_seq_len=fast.cache.max_seq_len)
        prompt = torch.tensor([[3, 1, 4]])
        prefill(fast.decode_model, prompt, fast.cache)
        prefill(model, prompt, cache)
        expected = model(torch.tensor([[5]]), cache=cache, input_pos=torch.tensor([3]), check=False)[:, -1]  # (1, V)
        got = fast.step(torch.tensor([[5]]), torch.tensor([3]))
    assert (got - expected).abs().max() <= 1e-4 * expected.abs().max()


@pytest.mark.skipif(not compile_available(), reason="torch.compile needs a C++ compiler on the CPU")
def test_default_cpu_step_multiplies_by_generated_sums_with_the_tokens_and_logits_of_eager(model):
    """The default on a CPU (gemv="sums"): every one-row product of the compiled step is inductor's own loop
    (row_sums.py), so the step calls no matrix-multiply kernel; greedy tokens are generate's and logits the
    eager step's to float rounding. gemv="library" calls torch's kernel for the same products."""
    from helpers.measure.profiling import profile_step

    prompt = [2, 7, 1, 8]
    ref = generate(model, prompt, 40)
    ops = {}
    for gemv in ("sums", "library"):
        # the generated Python caller: the C++ one (the CPU default) calls the kernels past the profiler
        fast = FastGenerator(model, max_seq_len=64, cpp_wrapper=False, gemv=gemv)
        assert fast.gemv == gemv and torch.equal(fast.generate(prompt, 40), ref) and fast.compiled
        ops[gemv] = set(profile_step(partial(fast.step, torch.tensor([[3]]), torch.tensor([50])), steps=2).ops)
    matmuls = {"aten::mm", "aten::addmm", "aten::matmul", "aten::linear", "aten::bmm"}
    assert not ops["sums"] & matmuls, ops["sums"] & matmuls
    assert ops["library"] & matmuls
    fast = FastGenerator(model, max_seq_len=48)  # the default, with the C++ wrapper and frozen weights
    assert fast.gemv == "sums" and fast.freeze and fast.cpp_wrapper
    for prompt in ([3, 1, 4, 1, 5], [9]):
        assert torch.equal(fast.generate(prompt, 40), generate(model, prompt, 40))
    assert fast.compiled
    assert_step_logits_match_eager(fast, model)


def test_gemv_choice_is_checked(model):
    with pytest.raises(ValueError, match="gemv must be one of"):
        FastGenerator(model, compile=False, gemv="blas")
    with pytest.raises(ValueError, match="gemm_autotune"):
        FastGenerator(model, compile=False, gemv="sums", gemm_autotune=True)
    with pytest.raises(ValueError, match="input_major"):
        FastGenerator(model, compile=False, gemv="sums", input_major=True)
    assert FastGenerator(model, compile=False, gemm_autotune=True).gemv == "library"  # its GEMMs are library ones
    assert FastGenerator(model, compile=False, input_major=False).gemv == "library"  # a layout for torch's kernel


def test_row_sum_linear_is_nn_linear_eagerly_and_to_rounding_compiled():
    # eagerly exactly F.linear over the shared weight; compiled, one row is generated sums over a panel copy
    # (or, when N is not a multiple of PANEL * PANEL_BLOCKS, ROW_SPLIT sums over W) and up to MAX_SUM_ROWS
    # rows one sum per row, equal to float rounding; more rows take F.linear
    from helpers.row_sums import MAX_SUM_ROWS, PANEL, PANEL_BLOCKS, ROW_SPLIT, panel_copy, row_split

    g = torch.Generator().manual_seed(4)
    w = torch.randn(96, 64, generator=g)
    layer = RowSumLinear(w)
    assert layer.weight is w and row_split(96) == ROW_SPLIT and row_split(97) == 1
    assert layer.panels.shape == (96 // PANEL, 64, PANEL) and not layer.panels.requires_grad
    p, k, j = 5, 17, 3
    assert layer.panels[p, k, j] == w[p * PANEL + j, k] and torch.equal(layer.panels, panel_copy(w))
    odd = RowSumLinear(torch.randn(PANEL * PANEL_BLOCKS + PANEL, 64, generator=g))  # 48 rows: no panel copy
    assert odd.panels is None and RowSumLinear(w, panels=False).panels is None
    xs = [torch.randn(1, M, 64, generator=g) for M in (1, 4, MAX_SUM_ROWS, MAX_SUM_ROWS + 1)]
    with torch.no_grad():
        for lin in (layer, odd):
            for x in xs:
                assert torch.equal(lin(x), torch.nn.functional.linear(x, lin.weight))
            if compile_available():
                for x in xs:
                    got = torch.compile(lin, fullgraph=True, dynamic=False)(x)
                    assert got.shape == (*x.shape[:-1], lin.weight.shape[0])
                    assert torch.allclose(got, torch.nn.functional.linear(x, lin.weight), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not compile_available(), reason="torch.compile needs a C++ compiler on the CPU")
def test_few_token_forward_multiplies_by_generated_sums(model):
    """A compiled forward of up to MAX_SUM_ROWS tokens (a verify pass) calls no matrix-multiply kernel, one
    of more tokens calls torch's; both give the eager static path's logits to float rounding."""
    from helpers.measure.profiling import profile_step
    from helpers.row_sums import MAX_SUM_ROWS

    matmuls = {"aten::mm", "aten::addmm", "aten::matmul", "aten::linear", "aten::bmm"}
    fast = FastGenerator(model, max_seq_len=64, cpp_wrapper=False)
    fast.warmup(token_counts=(4, MAX_SUM_ROWS + 1))
    for T, calls_library in ((4, False), (MAX_SUM_ROWS + 1, True)):
        tokens, pos = torch.arange(3, 3 + T).view(1, T), torch.arange(T)
        ops = set(profile_step(partial(fast.forward, tokens, pos), steps=2).ops)
        assert bool(ops & matmuls) == calls_library, (T, ops & matmuls)
        got = fast.forward(tokens, pos)  # (1, T, V)
        cache = type(fast.cache).for_model(model, max_seq_len=64)
        with torch.no_grad():
            expected = model(tokens, cache=cache, input_pos=pos, check=False)  # (1, T, V)
        assert (got - expected).abs().max() <= 1e-4 * expected.abs().max()
    with pytest.raises(ValueError, match="weight"):
        RowSumLinear(torch.randn(4))


_FROZEN_FROM_CACHE = """
import sys, torch
from conftest import random_model
from helpers.fast_decode import FastGenerator
from helpers.model import ModelConfig
model = random_model(ModelConfig.from_preset("tiny"), seed=int(sys.argv[1]))
fast = FastGenerator(model, max_seq_len=32)
fast.warmup()
cache, token, pos = fast.cache, torch.tensor([[7]]), torch.tensor([0])
with torch.no_grad():
    eager = model(token, cache=type(cache).for_model(model, max_seq_len=32), input_pos=pos, check=False)[:, -1]
    compiled = fast.step(token, pos)
print(fast.compiled, fast.compile_source, float((compiled - eager).abs().max()))
"""


@pytest.mark.skipif(not compile_available(), reason="torch.compile needs a C++ compiler on the CPU")
def test_frozen_step_from_the_cache_reads_its_own_weights(tmp_path):
    # the compile cache keys frozen weights by shape, not value: a second model of the same shapes loads
    # the first one's generated code, and must still compute with its own weights
    import os
    import subprocess
    import sys

    root = str(REPO)
    env = os.environ | {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "PYTHONPATH": root}
    results = []
    for seed in (1, 2):
        out = subprocess.run(
            [sys.executable, "-c", _FROZEN_FROM_CACHE, str(seed)],
            env=env,
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        )
        compiled, *source, gap = out.stdout.split()
        results.append((compiled, " ".join(source), float(gap)))
    assert [r[1] for r in results] == ["compiled cold", "compiled from the on-disk cache"]
    assert all(r[0] == "True" and r[2] < 1e-5 for r in results)


def test_input_major_linear_picks_the_layout_by_row_count():
    # one row: the (in, out) copy (the faster matrix-vector kernel); several rows: nn.Linear's (out, in)
    # weight (the faster kernels for a few rows): each path is exactly that product
    w = torch.randn(96, 64, generator=torch.Generator().manual_seed(2))
    layer = fast_decode.InputMajorLinear(w)
    x1, x4 = torch.randn(1, 1, 64), torch.randn(1, 4, 64)
    with torch.no_grad():
        assert torch.equal(layer(x1), x1 @ w.t().contiguous())
        assert torch.equal(layer(x4), torch.nn.functional.linear(x4, w))


def test_importing_sets_nothing_building_a_generator_does():
    """No work at import: importing helpers.fast_decode leaves the environment and dynamo alone; building a
    FastGenerator points inductor's cache at the course's folder (unless TORCHINDUCTOR_CACHE_DIR is set)."""
    import os
    import subprocess
    import sys

    code = (
        "import os, sys\n"
        "import helpers.fast_decode, helpers.speculative, helpers.bench\n"
        "print(os.environ.get('TORCHINDUCTOR_CACHE_DIR'), 'torch._dynamo' in sys.modules)\n"
        "from helpers.model import ModelConfig, Transformer\n"
        "fast = helpers.fast_decode.FastGenerator(Transformer(ModelConfig.from_preset('tiny')), compile=False)\n"
        "import torch._dynamo\n"
        "print(os.environ.get('TORCHINDUCTOR_CACHE_DIR'), torch._dynamo.config.recompile_limit >= 64)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=REPO)
    before, after = out.stdout.split("\n")[:2]
    assert before == "None False"
    assert after == f"{fast_decode.inductor_cache_dir()} True"
