"""The live sampling panel without a browser: one chart image updated in place at a fixed size, and a
plain-text form that tells a reader of the saved notebook how to get the sliders."""
import struct

import ipywidgets  # noqa: F401  (a hard requirement: without it the test fails, never skips)

from helpers import load_model  # noqa: E402
from helpers.course.widgets import PANEL_DPI, PANEL_FIGSIZE, sampling_panel  # noqa: E402


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])  # the IHDR chunk: width, height


def test_panel_updates_one_image_in_place_at_a_fixed_size():
    model, tok = load_model("target")
    panel = sampling_panel(model, tok, "import os\nimport sys\n", max_new_tokens=8)
    assert "run the notebook" in repr(panel)
    sliders, chart, summary = panel.children
    size = (int(PANEL_FIGSIZE[0] * PANEL_DPI), int(PANEL_FIGSIZE[1] * PANEL_DPI))
    before, text_before = chart.value, summary.value
    assert png_size(before) == size and chart.layout.height == f"{size[1]}px"
    sliders.children[0].value = 1.5  # temperature
    assert chart.value != before and summary.value != text_before  # the same widgets, new content
    assert png_size(chart.value) == size
    assert panel.children[1] is chart  # still the one image
