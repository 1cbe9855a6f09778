"""Exercise checks for chapter 06 (FLOPs and memory). Worked solutions:
notebooks/solutions/06_flops_and_memory_solutions.ipynb."""
from __future__ import annotations

from . import FROM_NOTEBOOK, exercise

GB = 1e9
M2_ULTRA_BANDWIDTH = 800e9  # spec sheet, as in the chapter


def _llama70b():
    from ...model import ModelConfig

    return ModelConfig(vocab_size=128256, max_seq_len=8192, n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8,
                       d_ff=28672, rope_theta=500000.0)


def check_1(answer=FROM_NOTEBOOK):
    """(Llama-3-70B's parameter count, untied; 2P / (2 P_matmul))."""
    from ...measure.flops import matmul_parameters, parameter_count

    cfg = _llama70b()
    p = parameter_count(cfg, tied_embeddings=False)

    def is_right(a):
        params, ratio = a
        return params == p and abs(float(ratio) - p / matmul_parameters(cfg)) < 1e-4

    exercise("06.1", answer, is_right, hint="build the ModelConfig; count with tied_embeddings=False",
             name="answer_70b")


def check_2(answer=FROM_NOTEBOOK):
    """(intensities at batch 1, 16, 64, 256 with 1,024 cached tokens; the limit at batch 10**6), Llama-3-8B bf16."""
    from ...measure.flops import arithmetic_intensity
    from ...model import ModelConfig

    cfg8 = ModelConfig.from_preset("llama3-8b")
    want = [arithmetic_intensity(cfg8, 1, n_past=1024, batch_size=b) for b in (1, 16, 64, 256)]
    limit = arithmetic_intensity(cfg8, 1, n_past=1024, batch_size=10**6)

    def is_right(a):
        intensities, lim = a
        assert len(intensities) == 4, "four intensities, one per batch size"
        return all(abs(x - y) < 1e-6 * y for x, y in zip(intensities, want)) and abs(lim - limit) < 1e-6 * limit

    exercise("06.2", answer, is_right, hint="arithmetic_intensity(cfg8, 1, n_past=1024, batch_size=b)",
             name="answer_batching")


def check_3(answer=FROM_NOTEBOOK):
    """(Llama-3-70B 4-bit weight GB, its batch-1 decode ceiling on an M2 Ultra in tokens/s)."""
    from ...measure.flops import weight_bytes

    nbytes = weight_bytes(_llama70b(), 4, tied_embeddings=False)

    def is_right(a):
        gb, tok_s = a
        return abs(float(gb) - nbytes / GB) < 0.01 and abs(float(tok_s) - M2_ULTRA_BANDWIDTH / nbytes) < 0.01

    exercise("06.3", answer, is_right, hint="bandwidth / weight bytes, with 4 bits per weight", name="answer_70b_int4")
