"""Where the course's files live: every folder the package reads or writes, named once.

    from helpers.paths import CHECKPOINTS, figures_dir
    CHECKPOINTS / "target.safetensors"      # a shipped checkpoint
    figures_dir() / "05_paged_kv.png"       # where this run's figures go

What is committed: `CHECKPOINTS` (helpers/checkpoints/: weights, tokenizer, MANIFEST.json), `SPEC_SHEETS`
(the published link and GPU figures helpers.parallel.interconnect reads), `DATA`
(data/validation.txt.gz, the held-out text every chapter measures), `COMMITTED_FIGURES` (figures/).
What a run makes, all under the untracked `CACHE` (.cache/): token arrays of the corpus, inductor's
generated code (`INDUCTOR_CACHE`, one folder per instruction set: fast_decode.inductor_cache_dir says
why), the figures of a learner's runs, GGUF exports, pytest's own cache. `RUNS` (runs/<name>/) holds
training state, so an interrupted run continues.

Left out: any folder outside the checkout (the Python standard library the corpus is read from is
found by `data.stdlib_root`), and creating folders: each writer makes its own when it first writes.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent  # helpers/
REPO = PACKAGE.parent  # the checkout: notebooks/, figures/, data/, helpers/
CHECKPOINTS = PACKAGE / "checkpoints"  # shipped with the package (package data)
SPEC_SHEETS = PACKAGE / "parallel" / "spec_sheets.toml"  # published link and GPU figures (package data)
DATA = REPO / "data"
COMMITTED_FIGURES = REPO / "figures"
RUNS = REPO / "runs"
CACHE = REPO / ".cache"
INDUCTOR_CACHE = CACHE / "inductor"
GGUF = CACHE / "gguf"


def figures_dir() -> Path:
    """Where figures go: LLM_COURSE_FIGURES when set, else .cache/figures/ (untracked), so running a notebook
    or the bench never rewrites the committed figures/. scripts/run_notebooks.py sets the variable to figures/
    to regenerate those, and the test suite to a temp folder. Read at every call, so a process that sets the
    variable after importing the package (the test setup does) still gets its folder."""
    return Path(os.environ.get("LLM_COURSE_FIGURES") or CACHE / "figures")
