"""LLM inference, executed: the code behind the course notebooks.

    from helpers import load_model, generate
    model, tok = load_model("target")
    ids = generate(model, tok.encode("def fib(n):", bos=True), max_new_tokens=64)
    print(tok.decode(ids[0]))

Modules, one job each (chapter in brackets). At the top, the inference code a learner reads:
    model.py             the transformer: config presets, RMSNorm, RoPE, GQA attention, SwiGLU;
                         check_cache (a cache built for this model)                              [00, 01]
    tokenizer.py         byte-level BPE with byte-exact round trips                               [00, 01]
    checkpoint.py        load_model(): verified safetensors checkpoints (in checkpoints/)         [00]
    token_healing.py     the prompt boundary: back up the last token, re-choose it within its bytes [01]
    data.py              the corpus: the Python standard library's own source                    [00, 02]
    train.py             training (python -m helpers.train) and short in-notebook runs           [02, 03]
    train_tokenizer.py   python -m helpers.train_tokenizer: the BPE vocabulary from the corpus    [01]
    generate.py          prefill / decode_one_token / generate (the one decode loop),
                         generate_without_cache, generate_sliding_window                          [04, 05]
    stopping.py          stop conditions: end-of-text, stop sequences and strings, loops          [04]
    kv_cache.py          preallocated key/value buffers written by position; the cache contract
                         every cache keeps (layer(i).update, commit, truncate, reset)            [05]
    cache_layout.py      what a model fixes about every KV cache: layers, KV heads, head size,
                         dtype, device, the ModelConfig (CacheLayout.of(model))                   [05]
    sliding_window.py    a rolling KV cache; SinkKVCache keeps attention sinks                    [05, 08]
    fast_decode.py       a compiled, static-shape decode step (CUDA graphs on a GPU)              [07]
    decode_copy.py       the copy of a model that step runs: each projection's layout             [07]
    row_sums.py          its products of 1 to 8 rows as generated sums (CPU default)              [07, 12]
    many_rows.py         products of many rows on a CPU through oneDNN's GEMM (prefill)           [06, 07]
    compiling.py         torch.compile's plumbing for it: cache folder, options, warm-up          [07]
    export_gguf.py       python -m helpers.export_gguf: the course model as a GGUF file           [07]
    int8_kv.py           a KV cache stored as int8 codes, one scale per token and KV head         [08]
    sampling.py          logits -> token: temperature, top-k, top-p, min-p, penalties            [09]
    beam_search.py       beam search with length penalty and early stopping, equal to HF's        [10]
    regex_automaton.py   regular expressions -> a byte-level automaton                            [10]
    grammar.py           automaton -> per-state token masks; GrammarProcessor for generate        [10]
    quantize/            int8 / int4 by hand (arithmetic), layers on torch's real kernels
                         (linear, dynamic), a whole model (__init__)                              [11]
    nf4.py               the NF4 codebook from normal quantiles; quantize and dequantize by hand   [11]
    speculative/         speculative sampling: the rule, the loop, a round as one compiled graph,
                         prompt lookup, exactness tests                                           [12]
    serving/             continuous batching: paged KV blocks, scheduler, prefix caching,
                         chunked prefill, the engine; and the OpenAI-compatible server           [13, 14]
    serving/__main__.py  python -m helpers.serving: the course model behind OpenAI's API          [14]
    hf.py                conversion to HuggingFace LlamaForCausalLM (a test oracle)
Shared by all of them:
    paths.py             where every file lives: checkpoints, data, figures, the caches
    device.py            device choice, and waiting for it before a clock is read
    processes.py         processes we start: a free port, stop by PID, a child that dies with its parent
    progress.py          progress bars whose stored notebook text is the finished bar
    options.py           keywords passed on to another function, checked against its signature
    bench/               python -m helpers.bench: every speed claim as a measured ratio, one
                         module per group of rows, llama.cpp on the same weights                 [BENCHMARKS.md]
Three wings, each a folder with its own map in its __init__.py:
    measure/             timing (every timer), flops (counts from a config), roofline and calibration
                         (measured ceilings), profiling, evaluate (bits per byte)                 [02, 06, 07]
    parallel/            tensor and pipeline parallelism, the interconnect model, worker processes [15]
    course/              what the notebooks teach with: notebook setup, plotting, widgets, diagrams,
                         layer and attention maps, chapter 05's allocation simulator, exercises/

How the modules depend on each other (A above B when A imports B; nothing imports upwards, no cycles).
Counting each folder as one unit, the package, scripts/ and .ci/ make 39 units on 8 levels joined by 128
imports:
    level 1  tokenizer, sampling, stopping, regex_automaton, nf4, many_rows, device, processes, progress,
             paths, cache_layout, options: import nothing of the package
    level 2  model, row_sums (both multiply many rows through many_rows), grammar, data, compiling
    level 3  kv_cache (the cache contract: commit, truncate, reset), sliding_window, checkpoint, quantize/,
             hf, decode_copy
    level 4  generate, int8_kv, export_gguf, train_tokenizer, measure/
    level 5  fast_decode, beam_search, token_healing, train, parallel/, this file
    level 6  speculative/, serving/
    level 7  course/
    level 8  bench/ (it times everything below it), scripts/
The largest modules are serving/engine.py and model.py (about 480 lines each), then fast_decode.py (440);
speculative/, quantize/ and bench/ are folders of modules under 330 lines. Inside the wings: course/ has one
import between its modules (notebook setup uses plotting's style), parallel/ two (both parallel schemes
load their model through workers), measure/ three (roofline times with timing; calibration uses both).
"""

from .checkpoint import load_model, load_tokenizer
from .device import default_device
from .generate import decode_one_token, generate, generate_without_cache, prefill
from .kv_cache import KVCache
from .model import ModelConfig, Transformer
from .sampling import SamplingConfig

__all__ = [
    "load_model",
    "load_tokenizer",
    "default_device",
    "generate",
    "generate_without_cache",
    "prefill",
    "decode_one_token",
    "KVCache",
    "ModelConfig",
    "Transformer",
    "SamplingConfig",
]
