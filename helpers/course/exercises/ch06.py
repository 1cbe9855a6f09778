"""Exercise checks for chapter 06 (FLOPs and memory). Worked solutions:
notebooks/solutions/06_flops_and_memory_solutions.ipynb. Exercises 2 and 4 are predictions: a prediction within
the stated tolerance is right, and the check then says what the computed or measured value was."""

from __future__ import annotations

from . import FROM_NOTEBOOK, exercise, notebook_answer, prediction

GB = 1e9
M2_ULTRA_BANDWIDTH = 800e9  # spec sheet, as in the chapter


def _llama70b():
    from ...model import ModelConfig

    return ModelConfig.from_preset("llama3-70b")


def check_1(answer=FROM_NOTEBOOK):
    """(Llama-3-70B's parameter count, untied; 2P / (2 P_matmul))."""
    from ...measure.flops import matmul_parameters, parameter_count

    cfg = _llama70b()
    p = parameter_count(cfg, tied_embeddings=False)

    def is_right(a):
        params, ratio = a
        return params == p and abs(float(ratio) - p / matmul_parameters(cfg)) < 1e-4

    exercise(
        "06.1", answer, is_right, hint="build the ModelConfig; count with tied_embeddings=False", name="answer_70b"
    )


def check_2(answer=FROM_NOTEBOOK):
    """A prediction: the limit of Llama-3-8B's bf16 decode intensity for a very large batch, 4,096 tokens cached."""
    from ...measure.flops import arithmetic_intensity
    from ...model import ModelConfig

    limit = arithmetic_intensity(ModelConfig.from_preset("llama3-8b"), 1, n_past=4096, batch_size=10**7)

    def is_right(p):
        off = float(p) / limit - 1
        assert abs(off) < 0.1, f"{'above' if off > 0 else 'below'} the limit by more than 10%"
        return True

    exercise(
        "06.2",
        answer,
        is_right,
        name="predicted_limit",
        hint="per sequence: FLOPs 2 x matmul weights + attention's 4 L H D S, over 2 L H_kv D S x 2 bytes",
    )
    predicted = notebook_answer("predicted_limit")[0] if answer is FROM_NOTEBOOK else answer
    if isinstance(predicted, (int, float)) and abs(predicted / limit - 1) < 0.1:
        print(
            f"notice: the limit is {limit:.1f} FLOP/byte, far below an H100's ridge point of 295: at 4K tokens "
            f"per sequence batched decode stays memory-bound at any batch; 4 of it is attention's own intensity"
        )


def check_3(answer=FROM_NOTEBOOK):
    """(Llama-3-70B 4-bit weight GB, its batch-1 decode ceiling on an M2 Ultra in tokens/s)."""
    from ...measure.flops import weight_bytes

    nbytes = weight_bytes(_llama70b(), 4, tied_embeddings=False)

    def is_right(a):
        gb, tok_s = a
        return abs(float(gb) - nbytes / GB) < 0.01 and abs(float(tok_s) - M2_ULTRA_BANDWIDTH / nbytes) < 0.01

    exercise("06.3", answer, is_right, hint="bandwidth / weight bytes, with 4 bits per weight", name="answer_70b_int4")


def check_4(device="cpu", answer=FROM_NOTEBOOK):
    """A prediction checked by a measurement: one batch-1 decode step of bench-150m with 8 layers, in milliseconds."""
    import torch

    from ...device import default_dtype
    from ...measure.timing import decode_step_seconds
    from ...model import ModelConfig, Transformer

    def measure():
        with torch.device(device):
            torch.manual_seed(0)
            net = Transformer(ModelConfig.from_preset("bench-150m", n_layers=8)).to(default_dtype(device)).eval()
        return decode_step_seconds(net, n_steps=8, context=128, warmup=1) * 1e3

    # the roofline is a lower bound: a step takes somewhat longer than it, never several times less
    prediction(
        "06.4",
        answer,
        measure,
        within=(0.5, 4),
        unit="ms",
        hint="the bytes one step reads (forward_bytes), over the read roof for that many bytes (cal.read_roof)",
        notice="a weight stream runs at a fraction of the read roof, and a step adds its operators' fixed costs "
        "(compare section 6.2's 4-layer model)",
        name="predicted_ms",
    )
