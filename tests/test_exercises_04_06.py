"""Chapters 04-06's exercise checks: the worked answers pass, typical wrong answers fail with one line.
(The solutions notebooks run every check on its worked answer under nbval; the predictions checked by a timing
are exercised there only, since their measurement takes seconds.)"""

from __future__ import annotations

import pytest
import torch

from helpers import generate, load_model
from helpers.course.exercises import ExerciseNotRight, ch04, ch05, ch06


@pytest.fixture(scope="module")
def model_and_tok():
    return load_model("target", dtype=torch.float32)


class RepeatedLine:
    """The worked answer to exercise 04.1."""

    def __init__(self, tok):
        self.tok = tok

    def __call__(self, generated):
        seen = set()
        for line in (piece.strip() for piece in self.tok.decode(generated).split("\n")[:-1]):
            if line in seen:
                return True
            if line:
                seen.add(line)
        return False


class AnyNewline(RepeatedLine):
    """Wrong: fires at the first complete line."""

    def __call__(self, generated):
        return "\n" in self.tok.decode(generated)


class RepeatedToken(RepeatedLine):
    """Wrong: compares token ids, so it misses a newline merged into an indentation token."""

    def __call__(self, generated):
        newline = self.tok.encode("\n")[0]
        lines, current = [], []
        for t in generated:
            if t == newline:
                lines.append(tuple(current))
                current = []
            else:
                current.append(t)
        return any(line and lines.count(line) > 1 for line in lines)


def test_04_1_repeated_line(model_and_tok, capsys):
    model, tok = model_and_tok
    ch04.check_1(model, tok, RepeatedLine)
    assert "correct" in capsys.readouterr().out
    for wrong in (AnyNewline, RepeatedToken):
        with pytest.raises(ExerciseNotRight, match="should"):
            ch04.check_1(model, tok, wrong)


def test_04_2_and_04_3(model_and_tok, capsys):
    model, _ = model_and_tok
    with pytest.raises(ExerciseNotRight, match="> 0"):
        ch04.check_2(model, [1, 2, 3], -1.0)
    ch04.check_3((400 * 100 + 99 * 100 // 2) / 499)
    assert "correct" in capsys.readouterr().out
    with pytest.raises(ExerciseNotRight):
        ch04.check_3(5050 / 100)  # the ratio from an empty prompt


def test_05_1_and_05_2(capsys):
    ch05.check_1((57_344, 57_344 * 32768 / 2**30))
    ch05.check_2((59, 14))
    assert capsys.readouterr().out.count("correct") == 2
    with pytest.raises(ExerciseNotRight):
        ch05.check_1((131_072, 4.0))  # Llama-3-8B's (and Mistral-7B's) shape
    with pytest.raises(ExerciseNotRight):
        ch05.check_2((59, 59))


def test_05_3_ragged_pair(model_and_tok, capsys):
    model, tok = model_and_tok

    def one_at_a_time(prompts, n_new):  # the right tokens (not batched, which the check cannot see)
        return [generate(model, p, n_new)[0, len(p) :].tolist() for p in prompts]

    ch05.check_3(model, tok, one_at_a_time)
    assert "correct" in capsys.readouterr().out
    with pytest.raises(ExerciseNotRight, match="row 0"):
        ch05.check_3(model, tok, lambda prompts, n: one_at_a_time(prompts, n)[::-1])
    with pytest.raises(ExerciseNotRight, match="two lists"):
        ch05.check_3(model, tok, lambda prompts, n: [[0] * n])


def test_05_4_needs_a_positive_ratio(model_and_tok):
    with pytest.raises(ExerciseNotRight, match="> 0"):
        ch05.check_4(model_and_tok[0], 0.0)


def test_06_checks(capsys):
    from helpers.measure.flops import arithmetic_intensity, matmul_parameters, parameter_count, weight_bytes
    from helpers.model import ModelConfig

    cfg70 = ModelConfig(
        vocab_size=128256,
        max_seq_len=8192,
        n_layers=80,
        d_model=8192,
        n_heads=64,
        n_kv_heads=8,
        d_ff=28672,
        rope_theta=500000.0,
    )
    p70 = parameter_count(cfg70, tied_embeddings=False)
    ch06.check_1((p70, p70 / matmul_parameters(cfg70)))
    limit = arithmetic_intensity(ModelConfig.from_preset("llama3-8b"), 1, n_past=4096, batch_size=10**6)
    ch06.check_2(limit)
    nbytes = weight_bytes(cfg70, 4, tied_embeddings=False)
    ch06.check_3((nbytes / 1e9, 800e9 / nbytes))
    out = capsys.readouterr().out
    assert out.count("correct") == 3 and "notice:" in out
    with pytest.raises(ExerciseNotRight, match="below the limit"):
        ch06.check_2(limit - 4)  # attention's FLOPs left out, and more
    with pytest.raises(ExerciseNotRight, match="below the limit"):
        ch06.check_2(1.0)  # batch-1 decode's intensity
    with pytest.raises(ExerciseNotRight):
        ch06.check_3((nbytes / 1e9, 800e9 / (2 * nbytes)))
    with pytest.raises(ExerciseNotRight, match="> 0"):
        ch06.check_4("cpu", -5.0)


def test_checks_read_the_answer_from_the_notebook(capsys, monkeypatch):
    import __main__

    monkeypatch.delattr(__main__, "qwen", raising=False)
    ch05.check_1()  # not defined yet: says which cell to run
    assert "run the answer cell above first (it defines qwen)" in capsys.readouterr().out
    monkeypatch.setattr(__main__, "predicted_ms", ..., raising=False)
    ch06.check_4()  # still the exercise cell's ...: nothing is measured
    assert "not attempted yet" in capsys.readouterr().out
    monkeypatch.setattr(__main__, "dense_ratio_after_prompt", 44_950 / 499, raising=False)
    ch04.check_3()
    assert "correct" in capsys.readouterr().out
