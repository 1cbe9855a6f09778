"""pyproject.toml and requirements.txt name the same versions, so `pip install .` and the learner's
`pip install -r requirements.txt` give the package the same libraries."""

from __future__ import annotations

import re
import tomllib

from helpers.paths import REPO


def pins(lines) -> dict[str, str]:
    out = {}
    for line in lines:
        m = re.match(r"^\s*([A-Za-z0-9_.-]+)==([^\s#;]+)", line)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def test_package_dependencies_are_pinned_as_in_requirements():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = pins(project["dependencies"])
    required = pins((REPO / "requirements.txt").read_text().splitlines())
    assert len(declared) == len(project["dependencies"]), "every dependency is pinned with =="
    assert declared and all(required.get(name) == version for name, version in declared.items()), {
        n: (v, required.get(n)) for n, v in declared.items() if required.get(n) != v
    }
