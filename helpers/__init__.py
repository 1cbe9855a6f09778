"""LLM inference, executed: the code behind the course notebooks.

    from helpers import load_model, generate
    model, tok = load_model("target")
    ids = generate(model, tok.encode("def fib(n):", bos=True), max_new_tokens=64)
    print(tok.decode(ids[0]))

Modules, one job each (chapter in brackets):
    model.py             the transformer: config presets, RMSNorm, RoPE, GQA attention, SwiGLU   [00, 01]
    tokenizer.py         byte-level BPE with byte-exact round trips                               [00, 01]
    checkpoint.py        load_model(): verified safetensors checkpoints                           [00]
    token_healing.py     the prompt boundary: back up the last token, re-choose it within its bytes [01]
    layer_map.py         a drawn map of one transformer block with every tensor's shape          [01]
    data.py              the corpus: the Python standard library's own source                    [00, 02]
    train.py             training (python -m helpers.train) and short in-notebook runs           [02, 03]
    evaluate.py          bits per byte on held-out text                                           [02]
    attention_maps.py    attention weights recomputed from a layer's own weights                  [03]
    generate.py          prefill / decode_one_token / generate (the one decode loop), and
                         generate_without_cache                                                   [04]
    stopping.py          stop conditions: end-of-text, stop sequences and strings, loops          [04]
    kv_cache.py          preallocated key/value buffers written by position                       [05]
    sliding_window.py    a rolling KV cache; SinkKVCache keeps attention sinks                    [05, 08]
    paged_kv.py          contiguous vs paged KV allocation, simulated                             [05]
    diagrams.py          concept diagrams (the cache growing step by step)                        [05]
    flops.py             parameter, FLOP and byte counts from a config                            [06]
    roofline.py          measured peak FLOP/s and memory bandwidth                                [06]
    profiling.py         one decode step under torch.profiler: op counts, matmul share            [07]
    fast_decode.py       a compiled, static-shape decode step (CUDA graphs on a GPU)              [07]
    export_gguf.py       python -m helpers.export_gguf: the course model as a GGUF file           [07]
    int8_kv.py           a KV cache stored as int8 codes, one scale per token and KV head         [08]
    sampling.py          logits -> token: temperature, top-k, top-p, min-p, penalties            [09]
    widgets.py           the sampling panel (sliders over the real model)                         [09]
    beam_search.py       beam search with length penalty and early stopping, equal to HF's        [10]
    regex_automaton.py   regular expressions -> a byte-level automaton                            [10]
    grammar.py           automaton -> per-state token masks; GrammarProcessor for generate        [10]
    quantize.py          int8 / int4 by hand, and linear layers on torch's real kernels           [11]
    speculative.py       speculative sampling with a draft model or prompt lookup                 [12]
    diagrams_speculative.py  one speculative round, drawn                                        [12]
    serving/             continuous batching: paged KV blocks, scheduler, prefix caching,
                         chunked prefill, the engine; and the OpenAI-compatible server           [13, 14]
    serving/__main__.py  python -m helpers.serving: the course model behind OpenAI's API          [14]
    tensor_parallel.py   Megatron-style tensor parallelism over torch.distributed                 [15]
    pipeline_parallel.py layers split across ranks, sequences in flight                          [15]
    interconnect.py      published link and memory figures, the all-reduce cost model            [15]
    workers.py           worker processes joined by gloo on loopback, bounded, stopped by PID     [15]
    exercises/           the exercise checks, one module per chapter (solutions: notebooks/solutions/)
    bench.py             python -m helpers.bench: every speed claim as a measured ratio           [BENCHMARKS.md]
    device.py            device choice and honest timing
    notebook.py          the first cell of every notebook
    plotting.py          one figure style, saved to figures/ (or .cache/figures/ for a learner's runs)
    progress.py          progress bars whose stored notebook text is the finished bar
    hf.py                conversion to HuggingFace LlamaForCausalLM (a test oracle)
"""
from .checkpoint import load_model, load_tokenizer
from .device import default_device
from .generate import decode_one_token, generate, generate_without_cache, prefill
from .kv_cache import KVCache
from .model import ModelConfig, Transformer
from .sampling import SamplingConfig

__all__ = ["load_model", "load_tokenizer", "default_device", "generate", "generate_without_cache", "prefill",
           "decode_one_token", "KVCache", "ModelConfig", "Transformer", "SamplingConfig"]
