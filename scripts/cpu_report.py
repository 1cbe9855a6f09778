"""Which CPU-restricting variables take effect here, shown on the course model's own logits.

    python scripts/cpu_report.py

Runs the shipped target model on one fixed prompt in a fresh process for each variable of the
portability check alone, for all of them together, and for none (the baseline), and prints for each:
the kernel level ATen reports, whether fbgemm's dynamic int8 kernel saturates, the largest logit
difference from the baseline and whether the greedy tokens agree. .ci/run prints it before running
the notebooks on the restricted CPU. The variables set in the calling environment are ignored: every
row starts from a clean one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

VARIABLES = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
}

PROBE = """
import json, torch
from helpers import generate, load_model
from helpers.quantize import dynamic_int8_saturates
torch.set_num_threads(1)
model, tok = load_model("target", device="cpu")
ids = tok.encode("import os\\nimport sys\\n\\n\\ndef main(argv):", bos=True)
with torch.no_grad():
    logits = model(torch.tensor([ids]))[0].double()  # (T, V)
greedy = generate(model, ids, max_new_tokens=48)[0, len(ids):].tolist()
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "saturates": dynamic_int8_saturates(),
                  "logits": logits.flatten().tolist(), "greedy": greedy}))
"""


def run(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    env.update({"OMP_NUM_THREADS": "1", **extra})
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    base = run({})
    rows = [(f"{k}={v}", run({k: v})) for k, v in VARIABLES.items()] + [("all four", run(VARIABLES))]
    print(f"{'':36s} {'ATen kernels':>12s} {'int8 saturates':>14s} {'max |logit diff|':>16s} {'greedy':>9s}")
    print(
        f"{'baseline (no variable)':36s} {base['capability']:>12s} {str(base['saturates']):>14s} {'-':>16s} {'-':>9s}"
    )
    for name, r in rows:
        diff = max(abs(a - b) for a, b in zip(r["logits"], base["logits"]))
        same = "same" if r["greedy"] == base["greedy"] else "DIFFERS"
        print(f"{name:36s} {r['capability']:>12s} {str(r['saturates']):>14s} {diff:16.3g} {same:>9s}")


if __name__ == "__main__":
    main()
