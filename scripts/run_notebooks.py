"""Re-execute the course notebooks in place, deterministically, and save them with their outputs.

    python scripts/run_notebooks.py                 # every notebook in notebooks/
    python scripts/run_notebooks.py 04 06           # only those whose name starts with 04 or 06
    python scripts/run_notebooks.py solutions/      # the worked solutions (notebooks/solutions/)

Each notebook runs top to bottom in a fresh kernel on the CPU (so the stored outputs are the ones
strict nbval compares against on a CPU machine), with PYTHONHASHSEED=0. Volatile metadata (cell
timings, widget state and widget views) is stripped; execution counts are kept, as nbval needs them.
The notebook metadata is stored in the form JupyterLab writes when it opens and saves a notebook
(kernelspec "Python 3 (ipykernel)" and the kernel's language_info), so opening a notebook does not
change the file (on a Python other than the one that made them, JupyterLab still updates the version).
Figures the notebooks save land in figures/. Prints each notebook's run time.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's helpers/, however it is installed
from helpers.paths import COMMITTED_FIGURES, REPO  # noqa: E402

NOTEBOOKS = REPO / "notebooks"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def clean(nb) -> None:
    from helpers.course.widgets import PANEL_TEXT, saved_notebook_state

    nb.metadata.pop("widgets", None)
    if any(out.get("data", {}).get("text/plain") == PANEL_TEXT for cell in nb.cells for out in cell.get("outputs", [])):
        nb.metadata["widgets"] = saved_notebook_state()  # what a reopened notebook shows where the live panel was
    # what JupyterLab writes on save (language_info comes from the kernel that just ran the notebook)
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        cell.metadata.pop("collapsed", None)
        cell.metadata.pop("scrolled", None)
        cell.pop("id", None)
        for out in cell.get("outputs", []):
            out.get("data", {}).pop(WIDGET_VIEW, None)
            out.get("metadata", {}).pop(WIDGET_VIEW, None)
    nb.nbformat, nb.nbformat_minor = 4, 4


# measured by the first notebook that asks; set LLM_COURSE_CALIBRATION to share one file across invocations
RUN_CALIBRATION = os.environ.get("LLM_COURSE_CALIBRATION") or REPO / ".cache" / f"calibration-run-{os.getpid()}.json"


def run(path: Path, timeout: int = 900) -> float:
    from helpers.fast_decode import inductor_cache_dir  # one folder per instruction set (its docstring says why)

    nb = nbformat.read(path, as_version=4)
    env_overrides = {
        "PYTHONHASHSEED": "0",
        "CUDA_VISIBLE_DEVICES": "",
        "LLM_COURSE_DEVICE": "cpu",
        "OMP_NUM_THREADS": "1",
        "TORCHINDUCTOR_CACHE_DIR": inductor_cache_dir(),
        "LLM_COURSE_FIGURES": str(COMMITTED_FIGURES),  # the committed figures, whatever the caller set
        "LLM_COURSE_CHECK_FIGURES": "1",  # refuse a figure whose labels collide (course/figure_check.py)
        # one calibration for the whole run: each chapter prints the same ceilings (measure/calibration.py)
        "LLM_COURSE_CALIBRATION": str(RUN_CALIBRATION),
    }
    old = {k: os.environ.get(k) for k in env_overrides}
    os.environ.update(env_overrides)
    try:
        t0 = time.time()
        NotebookClient(
            nb,
            timeout=timeout,
            kernel_name="python3",
            resources={"metadata": {"path": str(path.parent)}},
            record_timing=False,
        ).execute()
        elapsed = time.time() - t0
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    clean(nb)
    nbformat.write(nb, path)
    return elapsed


def main(argv):
    prefixes = argv[1:]
    every = sorted(NOTEBOOKS.glob("*.ipynb")) + sorted(NOTEBOOKS.glob("solutions/*.ipynb"))
    paths = [p for p in every if not prefixes or str(p.relative_to(NOTEBOOKS)).startswith(tuple(prefixes))]
    if not paths:
        sys.exit(f"no notebooks match {prefixes} in {NOTEBOOKS}")
    total = 0.0
    for p in paths:
        t = run(p)
        total += t
        print(f"{str(p.relative_to(NOTEBOOKS)):60s} {t:6.1f} s", flush=True)
    print(f"{'total':60s} {total:6.1f} s")


if __name__ == "__main__":
    main(sys.argv)
