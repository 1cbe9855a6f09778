"""More than one process: chapter 15's tensor and pipeline parallelism on one machine.

    workers.py            worker processes joined by gloo on loopback, bounded in time, stopped by PID
    tensor_parallel.py    Megatron-style tensor parallelism: heads and MLP columns split across ranks
    pipeline_parallel.py  layers split across ranks, several sequences in flight
    interconnect.py       published link and memory figures, and the all-reduce cost model

Left out: more than one machine, GPUs in the tests (the same code runs with backend="nccl").
"""
