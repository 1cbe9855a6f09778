"""The package's house rules, checked on the tree as it is: small modules, public names across modules,
and no code outside a cache class setting a cache's length (CONTRIBUTING.md)."""

import ast
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES, SOFT_LINES, MAX_OVER_SOFT = 500, 400, 3


def helper_modules():
    return sorted((ROOT / "helpers").rglob("*.py"))


def python_sources():
    """(path, source) of every module in helpers/, tests/ and scripts/, and every notebook's code cells."""
    for folder in ("helpers", "tests", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path, path.read_text()
    for path in sorted((ROOT / "notebooks").rglob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        yield path, "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))


def private_imports(source: str) -> list[str]:
    """Names starting with one underscore imported from the course's own modules (relative or helpers.*)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("helpers")):
            found += [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    return found


LENGTH_WRITE = re.compile(r"(?<!self)\.length\s*(?:[-+*]?=)(?!=)")


def test_no_module_is_large():
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in helper_modules()}
    over_max = {p: n for p, n in sizes.items() if n > MAX_LINES}
    over_soft = {p: n for p, n in sizes.items() if n > SOFT_LINES}
    assert not over_max, f"modules over {MAX_LINES} lines: {over_max}"
    assert len(over_soft) <= MAX_OVER_SOFT, f"more than {MAX_OVER_SOFT} modules over {SOFT_LINES} lines: {over_soft}"


def test_no_private_name_is_imported_across_modules():
    offenders = {
        p.relative_to(ROOT).as_posix(): names for p, src in python_sources() if (names := private_imports(src))
    }
    assert not offenders, f"private names imported: {offenders}"


def test_only_cache_classes_set_a_length():
    offenders = [
        f"{p.relative_to(ROOT).as_posix()}:{i}: {line.strip()}"
        for p, src in python_sources()
        if p != Path(__file__).resolve()  # this file's own examples below
        for i, line in enumerate(src.splitlines(), 1)
        if LENGTH_WRITE.search(line)
    ]
    assert not offenders, "a cache's length set from outside the cache:\n" + "\n".join(offenders)


def test_the_checks_can_fail():
    assert private_imports("from helpers.model import _rope\nfrom .x import _y, z") == ["_rope", "_y"]
    assert private_imports("from torch import _C\nfrom __future__ import annotations") == []
    assert LENGTH_WRITE.search("cache.length = 3") and LENGTH_WRITE.search("cache.length += 1")
    assert not LENGTH_WRITE.search("self.length = 3") and not LENGTH_WRITE.search("assert cache.length == 3")
