"""Chapter 01's helpers: the layer map's shapes follow the config, and the exercise checks accept the right
answers and refuse wrong ones."""

import math

import pytest
import torch

from helpers.course.exercises import ExerciseNotRight, ch01
from helpers.course.layer_map import draw_layer_map, layer_map_steps
from helpers.model import ModelConfig


def test_layer_map_shapes_follow_the_config():
    cfg = ModelConfig.from_preset("target")
    steps = layer_map_steps(cfg, T=16)
    assert steps[0][2] == steps[-1][2] == "(1, 16, 256)"  # the residual stream keeps its shape
    ops = {op.split(":")[0]: (weight, shape) for op, weight, shape in steps}
    assert ops["wqkv"] == ("(384, 256)", "(1, 16, 384)")  # (8 + 2 + 2) heads x 32
    assert ops["w_gate_up"] == ("(1408, 256)", "(1, 16, 1408)")
    tiny = layer_map_steps(ModelConfig.from_preset("tiny"), T=3, B=2)
    assert tiny[0][2] == "(2, 3, 64)"


def test_layer_map_draws():
    import matplotlib

    matplotlib.use("Agg")
    fig = draw_layer_map(ModelConfig.from_preset("tiny"), T=4)
    assert fig.axes and fig.axes[0].get_title().startswith("One block")


def _encode_with_merges(tok):
    import re

    from helpers.tokenizer import SPLIT_PATTERN, merge_pair

    def encode(text):
        out = []
        for chunk in re.findall(SPLIT_PATTERN, text):
            ids = list(chunk.encode())
            for pair, new_id in tok.merges.items():
                ids = merge_pair(ids, pair, new_id)
            out.extend(ids)
        return out

    return encode


def test_exercise_checks_accept_right_answers(capsys):
    from helpers import load_model

    model, tok = load_model("target", device="cpu", dtype=torch.float32)
    ch01.check_1(ch01.tab_token_ratio(tok))
    ch01.check_2(_encode_with_merges(tok))
    ratio = ch01.rope_off_ratio(model, tok)
    assert 1.2 < ratio < math.log2(tok.vocab_size)  # positions matter, and losing them is not a uniform guess
    ch01.check_3(model, tok, ratio)
    assert capsys.readouterr().out.count("correct") == 3


def test_exercise_checks_refuse_wrong_answers():
    from helpers.checkpoint import load_tokenizer

    tok = load_tokenizer()
    with pytest.raises(ExerciseNotRight, match="this run measured"):
        ch01.check_1(0.85)  # "fewer bytes, fewer tokens"
    with pytest.raises(ExerciseNotRight, match="you get"):
        ch01.check_2(lambda text: list(text.encode()))  # no merges at all
    with pytest.raises(ExerciseNotRight, match="same count, different ids"):
        ch01.check_2(lambda text: [i + 1 for i in tok.encode(text)])
    ch01.check_1(...)  # not attempted yet: prints, does not raise
