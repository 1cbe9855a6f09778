"""helpers.progress in a notebook: the stored text is the finished bar, and a closed bar leaves plain text (no
widget, which a saved notebook reopened with a fresh kernel could not display)."""

import pytest

pytest.importorskip("ipywidgets")

import IPython.display  # noqa: E402

from helpers import progress  # noqa: E402


class Handle:
    def __init__(self):
        self.updates = []

    def update(self, obj, raw=False):
        self.updates.append((obj, raw))


@pytest.fixture
def shown(monkeypatch):
    handles = []

    def display(obj, display_id=None):
        assert display_id is True  # the bar keeps a handle to its own output
        handles.append(Handle())
        return handles[-1]

    monkeypatch.setattr(IPython.display, "display", display)
    return handles


def test_stored_text_is_the_finished_bar(shown):
    bar = progress.NotebookProgress(range(5), desc="evaluating", unit="batch")
    assert repr(bar.container) == "evaluating: 100%|██████████| 5/5"  # before it ran: how it will read
    list(bar)


@pytest.mark.parametrize("leave", [True, False])
def test_a_closed_bar_leaves_plain_text(shown, leave):
    bar = progress.NotebookProgress(range(3), desc="sampling", leave=leave)
    for _ in bar:
        pass
    assert shown[0].updates == [({"text/plain": "sampling: 100%|██████████| 3/3"}, True)]
    bar.close()  # closing again changes nothing
    assert len(shown[0].updates) == 1


def test_a_bar_stopped_early_says_where(shown):
    bar = progress.NotebookProgress(total=4, desc="timing")
    bar.update(1)
    bar.close()
    [text] = [u[0]["text/plain"] for u in shown[0].updates]
    assert text.startswith("timing:  25%|") and text.endswith("| 1/4")
