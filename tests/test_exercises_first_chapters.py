"""Chapters 00-03's exercise checks: the worked answers pass, wrong answers fail with one line saying what is
off, and a prediction is measured and judged against the measurement."""

import math

import pytest
import torch

from helpers.course.exercises import ExerciseNotRight, ch00, ch02, ch03, prediction
from helpers.model import ModelConfig, Transformer


@pytest.fixture(scope="module")
def course_model():
    from helpers import load_model

    return load_model("target", device="cpu", dtype=torch.float32)


def test_prediction_within_the_band_is_right_and_says_what_to_notice(capsys):
    prediction("0.9", 2.2, lambda: 2.0, unit="bits/byte", name="guess", rel_tol=0.25, notice="notice this")
    out = capsys.readouterr().out
    assert "Exercise 0.9: correct" in out and "notice: measured 2 bits/byte (0.91x your prediction); notice this" in out


def test_prediction_outside_the_band_fails_with_the_measurement():
    with pytest.raises(ExerciseNotRight, match=r"you predicted 1 bits/byte; this run measured 2 bits/byte.*-50% off"):
        prediction("0.9", 1.0, lambda: 2.0, unit="bits/byte", name="guess", rel_tol=0.25)
    with pytest.raises(ExerciseNotRight, match="ValueError"):
        prediction("0.9", "two", lambda: 2.0, unit="bits/byte", name="guess", rel_tol=0.25)


def test_prediction_not_attempted_measures_nothing(capsys):
    prediction("0.9", ..., lambda: 1 / 0, unit="x", name="guess", rel_tol=0.25)
    assert "not attempted yet" in capsys.readouterr().out


def test_ch00_block_params(capsys):
    for name in ["target", "draft", "tiny"]:  # the checker's formula is the model's own count
        cfg = ModelConfig.from_preset(name)
        assert ch00.block_parameters(cfg) == sum(p.numel() for p in Transformer(cfg).layers[0].parameters())
    ch00.check_1(ch00.block_parameters)
    assert "correct" in capsys.readouterr().out
    with pytest.raises(ExerciseNotRight, match="for the 'target' preset your function gives"):
        ch00.check_1(lambda cfg: ch00.block_parameters(cfg) - 2 * cfg.d_model)  # forgot the norms


def test_ch00_english_bits_per_byte_and_greedy_next(course_model, capsys):
    model, tok = course_model
    measured = ch00.measure_bits_per_byte(model, tok, ch00.ENGLISH)
    assert 1.5 * model.training_record["val_bits_per_byte"] < measured < math.log2(tok.vocab_size)
    ch00.check_2(model, tok, measured * 1.1)
    with pytest.raises(ExerciseNotRight, match="this run measured"):
        ch00.check_2(model, tok, model.training_record["val_bits_per_byte"])  # "as good as on code"

    def greedy_next(text):
        with torch.no_grad():
            logits = model(torch.tensor([tok.encode(text, bos=True)]))
        return tok.decode([int(logits[0, -1].argmax())])

    ch00.check_3(model, tok, greedy_next)
    assert capsys.readouterr().out.count("correct") == 2
    with pytest.raises(ExerciseNotRight, match="not the model's favourite"):
        ch00.check_3(model, tok, lambda text: " os")
    with pytest.raises(ExerciseNotRight, match="a str"):
        ch00.check_3(model, tok, lambda text: 3)


def test_ch03_masks(capsys):
    i, j = torch.arange(6).unsqueeze(1), torch.arange(6).unsqueeze(0)
    ch03.check_1(torch.where((j <= i) & (j > i - 3), 0.0, float("-inf")))
    ch03.check_2(ch03.reference_masked_softmax)
    assert capsys.readouterr().out.count("correct") == 2
    with pytest.raises(ExerciseNotRight, match="shape"):
        ch03.check_1(torch.zeros(5, 5))
    with pytest.raises(ExerciseNotRight, match="NaN"):  # the plain masked softmax: NaN in the padded rows
        ch03.check_2(lambda s, v: s.masked_fill(~v, float("-inf")).softmax(-1))
    with pytest.raises(ExerciseNotRight, match="not the masked softmax"):
        ch03.check_2(lambda s, v: torch.zeros_like(s))


def test_ch03_last_position_prediction(capsys):
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("tiny"))  # untrained: its loss sits at ln V
    batch = torch.randint(0, 256, (8, 17))
    measured = ch03.last_position_loss(model, batch)
    assert abs(measured - math.log(256)) < 0.3
    ch03.check_3(model, batch, measured)
    assert "correct" in capsys.readouterr().out
    with pytest.raises(ExerciseNotRight, match="nats/token"):
        ch03.check_3(model, batch, 1.0)


def test_ch02_checks(capsys):
    ch02.check_1(-math.log(0.1 / 2047))
    ch02.check_3(lambda p, n: sum(p + k for k in range(n)))
    ch02.check_4(1000, 16 * 1000)
    assert capsys.readouterr().out.count("correct") == 3
    with pytest.raises(ExerciseNotRight, match="count the positions"):
        ch02.check_3(lambda p, n: p + n - 1)  # one teacher-forced pass, not n passes
    with pytest.raises(ExerciseNotRight):
        ch02.check_4(1000, 8 * 1000)  # "AdamW keeps two copies": the state alone


def test_ch02_less_context_costs_bits(course_model, capsys):
    model, tok = course_model
    batch = torch.tensor(
        [
            tok.encode(
                "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
                "\n\nclass Stack:\n    def push(self, x):\n        self.items.append(x)\n",
                bos=True,
            )[:33]
        ]
    )  # (1, 33): one window of 32 predictions
    full = ch02.bits_per_byte_with_context(model, tok, batch, 32)
    one = ch02.bits_per_byte_with_context(model, tok, batch, 1)
    assert one > full  # less context, more bits
    ch02.check_2(model, tok, batch, one)
    assert "correct" in capsys.readouterr().out
    with pytest.raises(ExerciseNotRight, match="this run measured"):
        ch02.check_2(model, tok, batch, full)  # "the context does not matter"
    with pytest.raises(ValueError, match="must divide"):
        ch02.bits_per_byte_with_context(model, tok, batch, 5)


def test_a_right_answer_says_what_to_notice_and_a_wrong_one_does_not(capsys):
    from helpers.course.exercises import exercise

    exercise("0.8", 3, lambda a: a == 3, notice=lambda a: f"{a}, as it should be")
    assert capsys.readouterr().out == "Exercise 0.8: correct\n  notice: 3, as it should be\n"
    with pytest.raises(ExerciseNotRight):
        exercise("0.8", 4, lambda a: a == 3, notice=lambda a: 1 / 0)  # never computed for a wrong answer
    exercise("0.8", ..., lambda a: a == 3, notice=lambda a: 1 / 0)  # nor for one not attempted


def test_prediction_read_from_the_notebook(monkeypatch, capsys):
    import sys

    from helpers.course.exercises import FROM_NOTEBOOK

    prediction("0.9", FROM_NOTEBOOK, lambda: 1 / 0, unit="x", name="first_chapters_guess", rel_tol=0.25)
    assert "run the answer cell above first (it defines first_chapters_guess)" in capsys.readouterr().out
    monkeypatch.setattr(sys.modules["__main__"], "first_chapters_guess", 2.1, raising=False)
    prediction("0.9", FROM_NOTEBOOK, lambda: 2.0, unit="x", name="first_chapters_guess", rel_tol=0.25)
    assert "Exercise 0.9: correct" in capsys.readouterr().out
