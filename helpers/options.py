"""Keyword arguments passed on to another function, checked against that function's own signature.

An entry point that takes another function's keywords as **options (generate_without_cache and
FastGenerator.generate take generate()'s, the sampling panel takes sampling_view's slider settings) names
them once, in that function's signature: `keyword_options` fills in its defaults and refuses a name it
does not take, as a call would. Leaves out positional parameters and **kwargs of the other function.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace


def keyword_options(fn, options: dict, take=None, leave_out=()) -> SimpleNamespace:
    """`options` with `fn`'s defaults for the keyword parameters it leaves unset, as attributes. take: the
    names this entry point passes on (default: every parameter of `fn` that has a default); leave_out: names
    among them it cannot honour. Any other name in `options` raises TypeError, naming what it takes."""
    params = inspect.signature(fn).parameters.values()
    known = {p.name: p.default for p in params if p.default is not p.empty and (take is None or p.name in take)}
    known = {name: default for name, default in known.items() if name not in leave_out}
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {unknown}; this call takes {sorted(known)}")
    return SimpleNamespace(**{**known, **options})
