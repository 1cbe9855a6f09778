"""The live sampling panel without a browser: one chart image updated in place at a fixed size, a status
line that says "computing..." while a redraw runs, a text box that wraps only between tokens, and a
plain-text form (and a saved-notebook stand-in) that tell a reader of the saved notebook how to get the
sliders."""

import struct

import ipywidgets  # noqa: F401  (a hard requirement: without it the test fails, never skips)
import pytest

from helpers import load_model  # noqa: E402
from helpers.course.widgets import (  # noqa: E402
    PANEL_DPI,
    PANEL_FIGSIZE,
    PANEL_MODEL_ID,
    PANEL_TEXT,
    sampling_panel,
    sampling_view,
    saved_notebook_state,
)

PROMPT = "import os\nimport sys\n"


@pytest.fixture(scope="module")
def model_and_tok():
    return load_model("target")


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])  # the IHDR chunk: width, height


def test_panel_updates_one_image_in_place_at_a_fixed_size(model_and_tok):
    model, tok = model_and_tok
    panel = sampling_panel(model, tok, PROMPT, max_new_tokens=8)
    assert repr(panel) == PANEL_TEXT and panel.model_id == PANEL_MODEL_ID
    sliders, status, chart, summary = panel.children
    size = (int(PANEL_FIGSIZE[0] * PANEL_DPI), int(PANEL_FIGSIZE[1] * PANEL_DPI))
    before, text_before = chart.value, summary.value
    assert png_size(before) == size and chart.layout.height == f"{size[1]}px"
    seen = []
    status.observe(lambda change: seen.append(change["new"]), names="value")
    sliders.children[0].value = 1.5  # temperature
    assert chart.value != before and summary.value != text_before  # the same widgets, new content
    assert png_size(chart.value) == size
    assert panel.children[2] is chart  # still the one image
    assert "computing..." in seen[0] and "temperature 1.5" in seen[-1]  # the busy cue, then what is shown


def test_a_second_panel_closes_the_first_it_shares_the_model_id(model_and_tok):
    model, tok = model_and_tok
    first = sampling_panel(model, tok, PROMPT, max_new_tokens=4)
    second = sampling_panel(model, tok, PROMPT, max_new_tokens=4)
    assert first.comm is None and second.model_id == PANEL_MODEL_ID  # closed, so one live model has the id
    second.close()


def test_summary_plurals_greedy_line_and_token_boundaries(model_and_tok):
    model, tok = model_and_tok
    one = sampling_view(model, tok, PROMPT, temperature=1.0, top_k=1, max_new_tokens=4, plot=True)
    assert "kept 1 token of" in one.summary() and "1 token kept" in one.figure.axes[0].get_title()
    greedy = sampling_view(model, tok, PROMPT, temperature=0.0, max_new_tokens=4, plot=True)
    assert "greedy (temperature 0)" in greedy.summary() and "distribution at temperature 1" in greedy.summary()
    assert "T=0 (greedy)" in greedy.figure.axes[0].get_title()
    many = sampling_view(model, tok, PROMPT, temperature=1.0, top_p=0.95, max_new_tokens=4, plot=False)
    html = many.summary_html()
    assert "kept " in html and html.count("display: inline-block") == min(len(many.kept), 8) + (len(many.kept) > 8)


def test_saved_notebook_state_is_one_line_under_the_panels_model_id():
    state = saved_notebook_state()["application/vnd.jupyter.widget-state+json"]["state"]
    assert state[PANEL_MODEL_ID]["model_name"] == "HTMLModel"
    assert state[PANEL_MODEL_ID]["state"]["value"] == PANEL_TEXT
    assert saved_notebook_state() == saved_notebook_state()  # the same bytes in every stored notebook
