"""One benchmark command: every speed claim of the course, as ratios measured side by side in one run.

    python -m helpers.bench            # full run (several minutes on a 2-core CPU)
    python -m helpers.bench --quick    # about a minute: shorter generations, fewer repeats
    python -m helpers.bench --help     # every flag, and what each group of rows measures

Modules: runner.py (the command: flags, the order of the groups, the printed table and the JSON), rows.py
(Row, the result every group returns), one module per group of rows (decode.py, compiled.py, quantized.py,
speculative.py, speculative_batched.py, llama_cpp.py; chapter 13's rows are helpers/serving/bench.py),
report.py (the figures).
"""

from .rows import Row, ratios
from .runner import main

__all__ = ["Row", "main", "ratios"]
