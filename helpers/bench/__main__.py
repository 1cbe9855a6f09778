"""python -m helpers.bench: see helpers.bench.runner."""

from .runner import main

main()
