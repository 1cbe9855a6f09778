"""Export a shipped checkpoint to GGUF, the single-file format of llama.cpp and the tools built on it.

    python -m helpers.export_gguf target                  # -> .cache/gguf/target-f32.gguf
    python -m helpers.export_gguf draft --type f16 --out draft.gguf

The course model is a Llama in everything but its file, so the export is a renaming plus two layout
facts:

- **Shapes.** GGUF lists a tensor's dimensions fastest-first (ne0 = the number of columns), the reverse
  of torch's order; the bytes are the same row-major bytes. The `gguf` package reverses the shape itself.
- **RoPE.** Our attention (like HuggingFace's Llama) rotates the pairs (x_i, x_{i+D/2}) of each head
  ("rotate half"); llama.cpp's `llama` architecture rotates adjacent pairs (x_2i, x_2i+1). Reordering
  the rows of W_q and W_k inside every head (new row 2i = old row i, new row 2i+1 = old row i + D/2)
  makes its rotation compute ours: q and k get the same permutation, and a dot product does not change
  when both vectors are permuted alike, so every attention score is unchanged. W_v and W_o stay.

Types: f32 (exact), f16 (also exact: the checkpoints store float16 weights), q8_0 and q4_0 (llama.cpp's
own block formats, 32 weights per scale; quantized by the gguf package). `quantize_gguf` builds q8_0 and
q4_0 files the way a llama.cpp user would instead: llama.cpp's own quantizer (llama_model_quantize, through
llama-cpp-python) reading the f32 export, with its default choices per tensor (it may keep the tied
embedding in a wider type than the rest; the file's size says what it chose). Norm weights stay float32, as
llama.cpp requires. The tied output head is not written: llama.cpp reuses the token embedding.

The tokenizer travels as a GPT-2-style byte-level BPE vocabulary (tokens, merges, special ids), so
llama.cpp can decode our ids. Its pre-tokenizer ("gpt-2") splits text a little differently from ours
(tokenizer.py keeps digits inside identifiers), so compare the two on token ids, not on text.

Out of scope: other GGUF quantization types, importing GGUF files back, chat templates.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

import numpy as np
import torch

from .paths import GGUF

FILE_TYPES = ("f32", "f16", "q8_0", "q4_0")


def rope_half_to_adjacent(n_heads: int, head_dim: int) -> torch.Tensor:
    """Row order that turns a rotate-half projection into llama.cpp's adjacent-pair layout:
    new row h*D + 2i + s comes from old row h*D + s*D/2 + i (s = 0, 1)."""
    D = head_dim
    i = torch.arange(D // 2)
    within = torch.stack([i, i + D // 2], dim=1).reshape(D)  # (D,): 0, D/2, 1, D/2+1, ...
    return (torch.arange(n_heads).unsqueeze(1) * D + within).reshape(-1)  # (n_heads * D,)


def gguf_tensors(model) -> dict[str, np.ndarray]:
    """Every tensor llama.cpp needs, by its GGUF name, as float32 numpy arrays in torch's shape order,
    with W_q and W_k rows already in the adjacent-pair RoPE layout."""
    cfg = model.cfg
    q_dim, kv_dim = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    perm_q = rope_half_to_adjacent(cfg.n_heads, cfg.head_dim)
    perm_k = rope_half_to_adjacent(cfg.n_kv_heads, cfg.head_dim)

    def arr(t: torch.Tensor) -> np.ndarray:
        return t.detach().to("cpu", torch.float32).contiguous().numpy()

    out = {"token_embd.weight": arr(model.embed.weight)}  # (V, C)
    for i, layer in enumerate(model.layers):
        wq, wk, wv = layer.attn.wqkv.weight.split([q_dim, kv_dim, kv_dim], dim=0)  # (q_dim, C), (kv_dim, C) x2
        gate, up = layer.mlp.w_gate_up.weight.split(cfg.d_ff, dim=0)  # (F, C) each
        out |= {
            f"blk.{i}.attn_norm.weight": arr(layer.attn_norm.weight),
            f"blk.{i}.attn_q.weight": arr(wq[perm_q]),
            f"blk.{i}.attn_k.weight": arr(wk[perm_k]),
            f"blk.{i}.attn_v.weight": arr(wv),
            f"blk.{i}.attn_output.weight": arr(layer.attn.wo.weight),
            f"blk.{i}.ffn_norm.weight": arr(layer.mlp_norm.weight),
            f"blk.{i}.ffn_gate.weight": arr(gate),
            f"blk.{i}.ffn_up.weight": arr(up),
            f"blk.{i}.ffn_down.weight": arr(layer.mlp.w_down.weight),
        }
    out["output_norm.weight"] = arr(model.norm.weight)
    return out


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for every byte (how byte-level BPE vocabularies are written as text):
    printable Latin-1 bytes stand for themselves, the other 68 map to code points from 256 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def vocabulary(tok) -> tuple[list[str], list[int], list[str]]:
    """(token strings, token types, merges) in the form llama.cpp's "gpt2" tokenizer reads."""
    import gguf

    byte_char = bytes_to_unicode()
    as_text = lambda b: "".join(byte_char[x] for x in b)  # noqa: E731
    specials = {v: k for k, v in tok.special_tokens.items()}
    tokens = [specials.get(i) or as_text(tok.vocab[i]) for i in range(tok.vocab_size)]
    types = [int(gguf.TokenType.CONTROL if i in specials else gguf.TokenType.NORMAL) for i in range(tok.vocab_size)]
    merges = [
        f"{as_text(tok.vocab[a])} {as_text(tok.vocab[b])}"
        for (a, b), _ in sorted(tok.merges.items(), key=lambda kv: kv[1])
    ]
    return tokens, types, merges


def write_gguf(model, tok, path, file_type: str = "f32", name: str = "model") -> Path:
    """Write `model` (with its tokenizer) to a GGUF file llama.cpp loads as a `llama` model."""
    import gguf

    if file_type not in FILE_TYPES:
        raise ValueError(f"file_type must be one of {FILE_TYPES}; got {file_type!r}")
    cfg = model.cfg
    qtype = {
        "f32": gguf.GGMLQuantizationType.F32,
        "f16": gguf.GGMLQuantizationType.F16,
        "q8_0": gguf.GGMLQuantizationType.Q8_0,
        "q4_0": gguf.GGMLQuantizationType.Q4_0,
    }[file_type]
    ftype = {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
        "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    }[file_type]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"llm-inference-executed {name}")
    w.add_context_length(cfg.max_seq_len)
    w.add_embedding_length(cfg.d_model)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(cfg.d_ff)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(int(ftype))
    tokens, types, merges = vocabulary(tok)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")  # llama.cpp's name for GPT-2's pre-tokenizer
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tok.bos_id)
    w.add_eos_token_id(tok.eos_id)
    w.add_add_bos_token(False)  # our prompts carry their <|bos|> explicitly (tok.encode(..., bos=True))
    for name, a in gguf_tensors(model).items():
        if a.ndim == 1:  # norm weights: llama.cpp wants them in float32
            w.add_tensor(name, a)
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


LLAMA_FTYPES = {
    "f32": "LLAMA_FTYPE_ALL_F32",
    "f16": "LLAMA_FTYPE_MOSTLY_F16",
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
}


def quantize_gguf(src, dst, file_type: str, threads: int | None = None) -> Path:
    """llama.cpp's own quantizer (llama-cpp-python's llama_model_quantize) from the GGUF file `src` (an f32
    export) to `dst` in `file_type` ("q8_0", "q4_0", or "f16"), with llama.cpp's default per-tensor choices.
    Needs llama-cpp-python; raises ImportError without it and RuntimeError if llama.cpp reports a failure."""
    import ctypes

    import llama_cpp

    if file_type not in LLAMA_FTYPES or file_type == "f32":
        raise ValueError(f"file_type must be one of {[t for t in LLAMA_FTYPES if t != 'f32']}; got {file_type!r}")
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise ValueError(f"src must be an existing GGUF file; got {str(src)!r}")
    dst.parent.mkdir(parents=True, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, LLAMA_FTYPES[file_type])
    params.nthread = threads or torch.get_num_threads()
    with native_output_silenced():  # llama.cpp logs every tensor it converts on the process's stderr
        status = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if status != 0:
        raise RuntimeError(f"llama.cpp failed to quantize {src} to {file_type} (status {status})")
    return dst


@contextlib.contextmanager
def native_output_silenced():
    """Silence what llama.cpp prints meanwhile: file descriptors 1 and 2 point at /dev/null (C code's own
    writes), and so do Python's sys.stdout and sys.stderr (llama-cpp-python forwards llama.cpp's log through
    a Python callback that writes to sys.stderr, which a notebook kernel shows as cell output)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 1)
        os.dup2(null.fileno(), 2)
        try:
            with contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
                yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def read_gguf_tensors(path) -> dict[str, np.ndarray]:
    """The tensors of a GGUF file as float32 arrays in torch's shape order (dequantized if needed)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    out = {}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))  # GGUF lists dimensions fastest-first
        out[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
    return out


def default_path(name: str, file_type: str = "f32") -> Path:
    return GGUF / f"{name}-{file_type}.gguf"


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", choices=("target", "draft"), help="which shipped checkpoint")
    ap.add_argument("--type", default="f32", choices=FILE_TYPES, help="weight type (default f32)")
    ap.add_argument("--out", default=None, help="output file (default .cache/gguf/<name>-<type>.gguf)")
    args = ap.parse_args(argv)
    from .checkpoint import load_model

    model, tok = load_model(args.name, device="cpu", dtype=torch.float32)
    path = write_gguf(model, tok, args.out or default_path(args.name, args.type), args.type, name=args.name)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, {args.type})")
    return path


if __name__ == "__main__":
    main()
