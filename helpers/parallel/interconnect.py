"""What communication between devices costs: published link and memory figures, and the arithmetic
of a tensor-parallel decode step on them.

Every hardware figure here is PUBLISHED, NOT MEASURED: copied as the vendor's spec sheet states it
(`stated`), with the document named (`source`), and turned into bytes per second per direction by the
one rule written next to it. Nothing here was run on that hardware.

The cost model of one all-reduce of `payload` bytes over `p` ranks is the ring algorithm: a
reduce-scatter and an all-gather, 2 (p - 1) steps, each moving payload / p bytes over every link at
once, each paying a fixed latency `alpha`:

    t = 2 (p - 1) * alpha  +  2 (p - 1) / p * payload / bandwidth

Spec sheets give bandwidth, not the per-step latency of a collective (that depends on the library,
the kernel launch and the topology), so latency enters only as a parameter the caller picks and names.

Left out: tree and in-switch (NVLS / SHARP) all-reduce algorithms, overlap of communication with
compute, congestion, prices.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..measure.flops import weight_bytes
from ..model import ModelConfig

GB = 1e9


@dataclass(frozen=True)
class Link:
    name: str
    stated: str  # the figure exactly as the spec sheet gives it
    bytes_per_s: float  # per direction, derived from `stated` by the rule in `rule`
    rule: str
    source: str


@dataclass(frozen=True)
class GPU:
    name: str
    memory_bytes: float
    memory_bytes_per_s: float
    max_power_w: float
    link: str  # the key of its GPU-to-GPU link in LINKS
    stated: str
    source: str


LINKS: dict[str, Link] = {
    "nvlink-h100": Link("NVLink", "NVLink: 900GB/s", 450 * GB,
                        "900 GB/s counts both directions: 450 GB/s each way",
                        "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column"),
    "pcie5": Link("PCIe Gen5 x16", "PCIe Gen5: 128GB/s", 64 * GB,
                  "128 GB/s counts both directions: 64 GB/s each way",
                  "NVIDIA H100 Tensor Core GPU datasheet"),
    "pcie4-l40s": Link("PCIe Gen4 x16", "PCIe Gen4 x16: 64GB/s bidirectional", 32 * GB,
                       "64 GB/s bidirectional: 32 GB/s each way",
                       "NVIDIA L40S datasheet (it also states: NVLink support: No)"),
    "network-400g": Link("400 Gb/s network", "up to 400Gb/s (NDR InfiniBand / 400GbE)", 50 * GB,
                         "400 gigabits per second per direction / 8 bits per byte = 50 GB/s each way",
                         "NVIDIA ConnectX-7 adapter documentation"),
}

GPUS: dict[str, GPU] = {
    "H100 SXM": GPU("H100 SXM", 80 * GB, 3.35e12, 700, "nvlink-h100",
                    "80GB; 3.35TB/s; up to 700W", "NVIDIA H100 Tensor Core GPU datasheet"),
    "L40S": GPU("L40S", 48 * GB, 864 * GB, 350, "pcie4-l40s",
                "48GB GDDR6 with ECC; 864GB/s; 350W", "NVIDIA L40S datasheet"),
}

# Llama-3-70B's shape (its published config.json), built from the course's Llama-3-8B preset:
# same vocabulary, context and rotary base, wider and deeper, still 8 key/value heads.
LLAMA3_70B = ModelConfig.from_preset("llama3-8b", n_layers=80, d_model=8192, n_heads=64, d_ff=28672)


def _check_positive(name, value) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ValueError(f"{name} must be a number > 0; got {value!r}")


def _check_tp(tp_size) -> None:
    if not isinstance(tp_size, int) or isinstance(tp_size, bool) or tp_size < 1:
        raise ValueError(f"tp_size must be an int >= 1; got {tp_size!r}")


def ring_allreduce_seconds(payload_bytes: float, tp_size: int, bytes_per_s: float, latency_s: float = 0.0) -> float:
    """Time of one ring all-reduce: 2 (p-1) latency steps plus 2 (p-1)/p * payload at `bytes_per_s`."""
    _check_tp(tp_size)
    _check_positive("bytes_per_s", bytes_per_s)
    if tp_size == 1:
        return 0.0
    steps = 2 * (tp_size - 1)
    return steps * latency_s + steps / tp_size * payload_bytes / bytes_per_s


def allreduces_per_token(cfg: ModelConfig) -> int:
    """Two per layer: after attention and after the MLP."""
    return 2 * cfg.n_layers


def decode_step_budget(cfg: ModelConfig, tp_size: int, gpu: GPU, link: Link, *, batch_size: int = 1,
                       latency_s: float = 0.0, bytes_per_weight: float = 2, dtype=torch.bfloat16) -> dict:
    """Seconds of one decode step at tensor-parallel `tp_size`, split into
    "weights":   every rank reads its 1/tp_size of the weights once from memory (the batch-1 bound);
    "allreduce": 2 * n_layers ring all-reduces of batch_size * d_model elements over `link`
                 (bandwidth term, plus latency_s per ring step if given).
    Llama-3 does not tie its embedding and head, so both matrices count."""
    _check_tp(tp_size)
    weights_s = weight_bytes(cfg, 8 * bytes_per_weight, tied_embeddings=False) / tp_size / gpu.memory_bytes_per_s
    payload = batch_size * cfg.d_model * torch.empty((), dtype=dtype).element_size()
    comm_s = allreduces_per_token(cfg) * ring_allreduce_seconds(payload, tp_size, link.bytes_per_s, latency_s)
    return {"weights": weights_s, "allreduce": comm_s, "total": weights_s + comm_s}


def latency_budget_per_allreduce(cfg: ModelConfig, tp_size: int, gpu: GPU, share: float = 0.1,
                                 bytes_per_weight: float = 2) -> float:
    """The longest an all-reduce of one decode step may take if all of them together are to cost at
    most `share` of the time the rank spends reading its weights."""
    _check_positive("share", share)
    weights_s = decode_step_budget(cfg, tp_size, gpu, LINKS[gpu.link], bytes_per_weight=bytes_per_weight)["weights"]
    return share * weights_s / allreduces_per_token(cfg)
