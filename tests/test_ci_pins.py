"""What `.ci/run` installs is pinned (.ci/constraints.txt), so that a release of a dependency cannot
turn CI red by itself (issue 50, item 1: a Markdown release broke `mkdocs build --strict`): every
dependency pyproject.toml names, but torch and Triton (each pinned by its own line, on purpose), has
an exact pin there that pyproject's own range admits, and every pip install of the project in
.ci/run goes through it."""

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

tomllib = pytest.importorskip("tomllib")

REPO = Path(__file__).resolve().parents[1]
UNPINNED = {"torch", "triton"}


def pins() -> dict[str, str]:
    found = {}
    for line in (REPO / ".ci" / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version and re.fullmatch(r"[0-9][0-9A-Za-z.+-]*", version), f"not an exact pin: {line!r}"
            found[canonicalize_name(name)] = version
    return found


def requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    named = list(project["dependencies"]) + [r for extra in project["optional-dependencies"].values() for r in extra]
    return [Requirement(r) for r in named]


def test_every_dependency_is_pinned_within_its_range():
    pinned = pins()
    reqs = requirements()
    assert len(reqs) > 10
    loose = [str(r) for r in reqs if canonicalize_name(r.name) not in UNPINNED | set(pinned)]
    assert not loose, f"pin these in .ci/constraints.txt: {loose}"
    outside = [f"{r} (pinned {pinned[canonicalize_name(r.name)]})" for r in reqs if canonicalize_name(r.name) in pinned
               and not r.specifier.contains(pinned[canonicalize_name(r.name)], prereleases=True)]
    assert not outside, f"pins outside pyproject.toml's range: {outside}"
    assert not UNPINNED & set(pinned), "torch and Triton are pinned by .ci/run's own lines"


def test_every_install_of_the_project_in_ci_goes_through_the_pins():
    installs = [line for line in (REPO / ".ci" / "run").read_text().splitlines()
                if re.search(r"pip install\b.*-e \"\.\[", line)]
    assert len(installs) >= 2
    assert all("-c .ci/constraints.txt" in line for line in installs), installs
