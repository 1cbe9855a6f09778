"""The stored outputs of one regeneration run share one calibration (scripts/run_notebooks.py and
helpers/measure/calibration.py): every chapter that prints the ceilings prints the same line."""

import json
import re

from helpers.paths import REPO

CALIBRATION_LINE = re.compile(r"^.* threads: matmul [0-9.]+ GFLOP/s; read .*last-level cache\)$", re.MULTILINE)


def test_stored_chapters_print_one_calibration():
    # issue: chapters once printed different ceilings for "this machine"; one regeneration run now shares one
    # calibration, so every stored calibration line is the same line, and chapters 06, 07 and 11 print it
    lines = {}
    for path in sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            for out in cell.get("outputs", []):
                text = "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
                for line in CALIBRATION_LINE.findall(text):
                    lines.setdefault(line.strip(), set()).add(path.name[:2])
    printed_by = set().union(*lines.values()) if lines else set()
    assert {"06", "07", "11"} <= printed_by, f"chapters printing the calibration line: {sorted(printed_by)}"
    assert len(lines) == 1, "stored calibration lines differ: " + "; ".join(
        f"{sorted(chs)}: {line[:90]}" for line, chs in lines.items()
    )
