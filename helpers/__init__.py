"""LLM inference, executed: the code behind the course notebooks.

    from helpers import load_model, generate
    model, tok = load_model("target")
    ids = generate(model, tok.encode("def fib(n):", bos=True), max_new_tokens=64)
    print(tok.decode(ids[0]))

Modules, one job each (chapter in brackets):
    model.py           the transformer: config presets, RMSNorm, RoPE, GQA attention, SwiGLU   [00-02]
    tokenizer.py       byte-level BPE with byte-exact round trips                               [00]
    checkpoint.py      load_model(): verified safetensors checkpoints                           [00]
    data.py            the corpus: the Python standard library's own source                    [00, 02]
    train.py           training (python -m helpers.train) and short in-notebook runs           [02, 03]
    evaluate.py        bits per byte on held-out text                                           [02]
    attention_maps.py  attention weights recomputed from a layer's own weights                  [03]
    generate.py        prefill / decode_one_token / generate, and generate_without_cache       [04]
    stopping.py        stop conditions: loops, stop strings                                     [04]
    kv_cache.py        preallocated key/value buffers written by position                       [05]
    sliding_window.py  a rolling KV cache for sliding-window attention                          [05]
    paged_kv.py        contiguous vs paged KV allocation, simulated                             [05]
    flops.py           parameter, FLOP and byte counts from a config                            [06]
    roofline.py        measured peak FLOP/s and memory bandwidth                                [06]
    sampling.py        logits -> token: temperature, top-k, top-p, min-p, penalties            [09]
    widgets.py         the sampling panel (sliders over the real model)                         [09]
    quantize.py        int8 / int4 by hand, and linear layers on torch's real kernels           [11]
    speculative.py     speculative sampling with a draft model or prompt lookup                 [12]
    fast_decode.py     a compiled, static-shape decode step (CUDA graphs on a GPU)              [bench]
    bench.py           python -m helpers.bench: every speed claim as a measured ratio           [bench]
    device.py          device choice and honest timing
    notebook.py        the first cell of every notebook
    plotting.py        one figure style, saved to figures/
    progress.py        progress bars whose stored notebook text is the finished bar
    hf.py              conversion to HuggingFace LlamaForCausalLM (a test oracle)
"""
from .checkpoint import load_model, load_tokenizer
from .device import default_device
from .generate import decode_one_token, generate, generate_without_cache, prefill
from .kv_cache import KVCache
from .model import ModelConfig, Transformer
from .sampling import SamplingConfig

__all__ = ["load_model", "load_tokenizer", "default_device", "generate", "generate_without_cache", "prefill",
           "decode_one_token", "KVCache", "ModelConfig", "Transformer", "SamplingConfig"]
