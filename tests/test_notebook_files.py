"""Notebooks are stored in the form JupyterLab writes, so opening one and saving it leaves git clean
(measured: JupyterLab 4 rewrites the kernelspec display name and adds the kernel's language_info), and
without volatile metadata (cell timings, widget state other than the live panel's stand-in)."""

from __future__ import annotations

import json

import pytest

from helpers.course.widgets import saved_notebook_state
from helpers.paths import REPO

NOTEBOOKS = REPO / "notebooks"
ALL = sorted(NOTEBOOKS.glob("*.ipynb")) + sorted(NOTEBOOKS.glob("solutions/*.ipynb"))


@pytest.mark.parametrize("path", ALL, ids=lambda p: str(p.relative_to(NOTEBOOKS)))
def test_stored_as_jupyterlab_writes_it(path):
    nb = json.loads(path.read_text())
    assert nb["metadata"]["kernelspec"] == {
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
        "name": "python3",
    }
    assert nb["metadata"]["language_info"]["name"] == "python", "run scripts/run_notebooks.py to store it"
    if "widgets" in nb["metadata"]:  # only the stand-in for chapter 09's live panel (helpers.course.widgets)
        assert nb["metadata"]["widgets"] == saved_notebook_state()
    for cell in nb["cells"]:
        assert "execution" not in cell["metadata"], "cell timings are volatile"
