"""Progress bars: tqdm.auto, with a notebook bar whose stored text is the finished bar.

    from helpers.progress import progress_bar
    for batch in progress_bar(batches, desc="evaluating", unit="batch"):
        ...

In a terminal this is plain tqdm. In a notebook tqdm draws a widget, and a saved notebook also keeps
the widget's plain-text form, which is what a static render (GitHub, nbviewer) and nbval show. tqdm
computes that text once, when the bar first appears: a stored notebook then shows every bar frozen
at 0%, as if nothing ran. Here the plain-text form is the bar as it will read when done
(`evaluating: 100%|██████████| 5/5`, without timings, which differ every run), so the static page
shows a finished bar and nbval compares a line that is the same on every run. The live widget is
tqdm's own while the bar runs. When it closes, the widget's output is replaced by that plain text (the
bar as it stopped: finished, or where an error stopped it): a widget lives only as long as its kernel,
and a saved notebook reopened with a fresh kernel would otherwise show "Error displaying widget: model
not found" where the bar was. A bar without a known total has no finished form and keeps tqdm's text.
"""

from __future__ import annotations

from tqdm.auto import tqdm as _auto_tqdm

try:
    from tqdm.notebook import TqdmHBox
    from tqdm.notebook import tqdm as _notebook_tqdm
except ImportError:  # no ipywidgets: tqdm.auto is the console bar anyway
    TqdmHBox = _notebook_tqdm = None


def finished_text(bar, n: int | None = None) -> str | None:
    """The bar as it reads when done (or at `n`), without the [elapsed<remaining, rate] part; None if no total."""
    if bar.total is None:
        return None
    meter = bar.format_meter(**{**bar.format_dict, "n": bar.total if n is None else n, "elapsed": 0, "rate": None})
    return meter.split(" [")[0]


if _notebook_tqdm is not None:

    class _FinishedBox(TqdmHBox):
        """tqdm's widget container; only its plain-text form differs (the finished bar)."""

        def __repr__(self, pretty: bool = False) -> str:
            pbar = getattr(self, "pbar", None)
            text = finished_text(pbar) if pbar is not None else None
            return text if text is not None else super().__repr__(pretty)

    class NotebookProgress(_notebook_tqdm):
        """tqdm's notebook bar whose text form is the finished bar, replaced by that text when it closes
        (progress_bar returns one in a notebook; made directly, it is the same bar anywhere)."""

        def __init__(self, *args, **kwargs):
            self._handle = None  # the display of the widget, so that close() can replace it with text
            display_here = kwargs.pop("display", True)
            super().__init__(*args, display=False, **kwargs)
            if display_here and not self.disable and self.delay <= 0:
                self._show()

        @staticmethod
        def status_printer(_, total=None, desc=None, ncols=None):
            box = _notebook_tqdm.status_printer(_, total, desc, ncols)
            box.__class__ = _FinishedBox  # same widget, same traits; a different __repr__
            return box

        def _show(self):
            from IPython.display import display

            self._handle = display(self.container, display_id=True)
            self.displayed = True

        def display(self, msg=None, pos=None, close=False, bar_style=None, check_delay=True):
            super().display(msg, pos, close=close, bar_style=bar_style, check_delay=False)
            if check_delay and self.delay > 0 and not self.displayed:  # a delayed bar appears now
                self._show()

        def close(self):
            super().close()
            if self._handle is not None:
                text = finished_text(self, n=self.n) if self.total else repr(self.container)
                self._handle.update({"text/plain": text}, raw=True)  # the widget's output becomes plain text
                self._handle = None


def progress_bar(iterable=None, **kwargs):
    """tqdm.auto(iterable, **kwargs); in a notebook, a bar whose stored text is its finished form."""
    if _notebook_tqdm is not None and issubclass(_auto_tqdm, _notebook_tqdm):
        return NotebookProgress(iterable, **kwargs)
    return _auto_tqdm(iterable, **kwargs)
