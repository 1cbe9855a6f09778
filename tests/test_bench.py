"""The bench's plumbing, without timing anything: its rows, its flags, and the llama.cpp rows' clean skip."""

from __future__ import annotations

import sys

import pytest

from helpers.bench import Row, ratios
from helpers.bench.llama_cpp import FORMATS, llama_cpp_missing, rows_same_weights
from helpers.bench.runner import GROUPS, parse_args


def test_row_says_met_or_missed_and_whether_tokens_agree():
    row = Row(
        "x vs y", "y", "x", ratios([2.0, 3.0, 4.0], [1.0, 1.0, 1.0]), "1 ms", "2 ms", target=2.5, same_output=False
    )
    assert row.median == 3.0
    assert ">= 2.5x met" in row.line() and "DIFFERENT TOKENS" in row.line()
    row.target = 3.5
    assert "MISSED" in row.line()


def test_rows_flag_picks_groups_and_refuses_unknown_ones(capsys):
    assert parse_args([]).groups == list(GROUPS)
    assert parse_args(["--rows", "llama-cpp, bandwidth"]).groups == ["llama-cpp", "bandwidth"]
    with pytest.raises(SystemExit):
        parse_args(["--rows", "llama"])
    assert "unknown group(s) llama" in capsys.readouterr().err


def test_every_format_has_a_llama_cpp_partner_of_the_same_bits():
    assert {f: t for f, (_, _, t) in FORMATS.items()} == {
        "fp32": "f32",
        "fp16 weights": "f16",
        "int8": "q8_0",
        "int4": "q4_0",
    }


def test_llama_cpp_rows_skip_with_one_line_without_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp now raises ImportError
    assert llama_cpp_missing().startswith("llama.cpp rows skipped: llama_cpp is not installed")
    rows, lines = rows_same_weights(None, None, "any", 8, 1, lambda: None)
    assert rows == [] and len(lines) == 1 and lines[0] == llama_cpp_missing()
