"""Chapter 13's exercise checks (batching and serving)."""
from __future__ import annotations

import math

from . import FROM_NOTEBOOK, exercise


def check_1(blocks_held=FROM_NOTEBOOK):
    return exercise("13.1", blocks_held, lambda a: int(a) == a and a == math.ceil((37 + 20 - 1) / 16),
                    hint="KV is stored for the prompt and every generated token but the last", name="blocks_held")


def check_2(wasted_share=FROM_NOTEBOOK):
    lengths = [5, 40, 12, 40]
    right = 1 - sum(lengths) / (len(lengths) * max(lengths))
    return exercise("13.2", wasted_share, lambda a: abs(float(a) - right) < 1e-9,
                    hint="every row runs as many steps as the longest", name="wasted_share")


def check_3(tokens_skipped=FROM_NOTEBOOK):
    return exercise("13.3", tokens_skipped, lambda a: int(a) == a and a == 32,
                    hint="only full blocks are cached, and a block's hash covers everything before it",
                    name="tokens_skipped")
