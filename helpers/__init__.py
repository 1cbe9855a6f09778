"""LLM inference, executed: the code behind the course notebooks.

    from helpers import load_model, generate
    model, tok = load_model("target")
    ids = generate(model, tok.encode("def fib(n):", bos=True), max_new_tokens=64)
    print(tok.decode(ids[0]))

Modules, one job each:
    model.py        the transformer (config presets, RMSNorm, RoPE, GQA attention, SwiGLU)
    kv_cache.py     preallocated key/value buffers written by position
    generate.py     prefill / decode_one_token / generate, and generate_without_cache
    sampling.py     logits -> token: temperature, top-k, top-p, min-p, penalties
    tokenizer.py    byte-level BPE, byte-exact round trips
    checkpoint.py   load_model(): verified safetensors checkpoints
    data.py         the corpus (the Python standard library's source)
    evaluate.py     bits per byte on held-out text
    train.py        the training script (python -m helpers.train)
    flops.py        parameter, FLOP and byte counts from a config
    device.py       device choice and honest timing
    hf.py           conversion to HuggingFace LlamaForCausalLM (a test oracle)
"""
from .checkpoint import load_model, load_tokenizer
from .device import default_device
from .generate import decode_one_token, generate, generate_without_cache, prefill
from .kv_cache import KVCache
from .model import ModelConfig, Transformer
from .sampling import SamplingConfig

__all__ = ["load_model", "load_tokenizer", "default_device", "generate", "generate_without_cache", "prefill",
           "decode_one_token", "KVCache", "ModelConfig", "Transformer", "SamplingConfig"]
