"""What communication between devices costs: published link and memory figures, and the arithmetic
of a tensor-parallel decode step on them.

Every hardware figure here is PUBLISHED, NOT MEASURED: copied as the vendor's spec sheet states it
(`stated`), with the document named (`source`), and turned into bytes per second per direction by the
one rule written next to it. The figures are a table of data, spec_sheets.toml beside this module, read
into LINKS and GPUS at import. Nothing here was run on that hardware.

The cost model of one all-reduce of `payload` bytes over `p` ranks is the ring algorithm: a
reduce-scatter and an all-gather, 2 (p - 1) steps, each moving payload / p bytes over every link at
once, each paying a fixed latency `alpha`:

    t = 2 (p - 1) * alpha  +  2 (p - 1) / p * payload / bandwidth

Spec sheets give bandwidth, not the per-step latency of a collective (that depends on the library,
the kernel launch and the topology), so latency enters only as a parameter the caller picks and names.
What a real collective takes is a measurement on that hardware: PUBLISHED_ALLREDUCE_LATENCY holds the
few small-message all-reduce latencies published for one 8-GPU NVSwitch node, each with where it was
reported and how it was run.

Left out: tree and in-switch (NVLS / SHARP) all-reduce algorithms (the published latencies include
them), overlap of communication with compute, congestion, prices.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass

import torch

from ..measure.flops import weight_bytes
from ..model import ModelConfig
from ..paths import SPEC_SHEETS


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


def load_spec_sheets(path=SPEC_SHEETS) -> tuple[dict[str, Link], dict[str, GPU]]:
    """The links and GPUs of the spec-sheet table (spec_sheets.toml), in its order. A GPU figure stated for a
    whole system (`stated_for_gpus` = n) is divided by n, so every GPU's memory and bandwidth are its own."""
    with open(path, "rb") as f:
        sheets = tomllib.load(f)
    links = {key: Link(**fields) for key, fields in sheets["links"].items()}
    gpus = {}
    for name, fields in sheets["gpus"].items():
        fields = dict(fields)
        n = fields.pop("stated_for_gpus", 1)
        gpus[name] = GPU(
            name,
            memory_bytes=fields.pop("memory_bytes") / n,
            memory_bytes_per_s=fields.pop("memory_bytes_per_s") / n,
            **fields,
        )
    return links, gpus


LINKS, GPUS = load_spec_sheets()


@dataclass(frozen=True)
class PublishedLatency:
    setup: str  # the hardware, software and message size, as reported
    seconds: float
    source: str


# Small-message all-reduce latency on one 8-GPU NVSwitch node, as reported (not measured here). Both were run
# with nccl-tests' all_reduce_perf and CUDA graphs, tuned for small messages: what a well-set-up node reaches.
PUBLISHED_ALLREDUCE_LATENCY: dict[str, PublishedLatency] = {
    "8x H200, 8 bytes": PublishedLatency(
        "8x H200 (NVSwitch), 8-byte all-reduce, NCCL 2.27 symmetric memory, tuned for latency",
        2.3e-6,
        "NVIDIA/nccl GitHub issue #1940 (Dec 2025): 'about 2.3 us' on 8x H200 or 8x H800; 'around 3 us' on 8x B200",
    ),
    "2 of 8 H100, 128 B - 64 KB": PublishedLatency(
        "2 GPUs of an HGX 8x H100 node, 128 B to 64 KB all-reduce, NCCL 2.20.5, NVLink SHARP (NVLS)",
        6e-6,
        "NVIDIA/nccl GitHub issue #1259 (Apr 2024): 'approximately 6us' with 2 GPUs, rising with more GPUs",
    ),
}

# Llama-3-70B's shape (its published config.json): the model's "llama3-70b" preset
LLAMA3_70B = ModelConfig.from_preset("llama3-70b")


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


def decode_step_budget(
    cfg: ModelConfig,
    tp_size: int,
    gpu: GPU,
    link: Link,
    *,
    batch_size=1,
    latency_s=0.0,
    bytes_per_weight=2,
    dtype=torch.bfloat16,
) -> dict:
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


def latency_budget_per_allreduce(
    cfg: ModelConfig, tp_size: int, gpu: GPU, share: float = 0.1, bytes_per_weight: float = 2
) -> float:
    """The longest an all-reduce of one decode step may take if all of them together are to cost at
    most `share` of the time the rank spends reading its weights."""
    _check_positive("share", share)
    weights_s = decode_step_budget(cfg, tp_size, gpu, LINKS[gpu.link], bytes_per_weight=bytes_per_weight)["weights"]
    return share * weights_s / allreduces_per_token(cfg)
