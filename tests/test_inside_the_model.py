"""Chapter 01's helpers: the layer map's shapes follow the config, and the exercise checks accept the right
answers and refuse wrong ones."""
import math

import pytest

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


def test_exercise_checks_accept_right_answers(capsys):
    ch01.check_1(2 * 6 * 8 * 32 * 2)  # a wrong answer raises ExerciseNotRight
    ch01.check_2(1408)
    ch01.check_3([math.sin(3), math.cos(3), math.sin(0.03), math.cos(0.03)])
    ch01.check_4(500)
    assert capsys.readouterr().out.count("correct") == 4


def test_exercise_checks_refuse_wrong_answers():
    for check, wrong in [(ch01.check_1, 1536), (ch01.check_2, 1365), (ch01.check_3, [0.84, 0.54, 0.0, 1.0]),
                         (ch01.check_4, 2048)]:
        with pytest.raises(ExerciseNotRight):
            check(wrong)
    ch01.check_3(...)  # not attempted yet: prints, does not raise
