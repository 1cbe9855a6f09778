"""Measurement: counting and timing what the library does, beside the estimate of what it should cost.

    timing.py      the one way to time: synchronise, repeat, interleave, median; a decode step's seconds
    flops.py       parameter, FLOP and byte counts from a config (exact arithmetic, no timing)
    roofline.py    measured peak FLOP/s and memory bandwidth, the roofline bound of a step
    calibration.py this machine's ceilings measured once per process: matmul peak, read-only bandwidth
                   (main memory, one thread and all), copy bandwidth, in-cache read bandwidth; one summary line
    profiling.py   one decode step under torch.profiler: op counts, matmul share
    evaluate.py    bits per byte on held-out text

The bench (python -m helpers.bench) sits above these and times every speed claim as a ratio.
"""
