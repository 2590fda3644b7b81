"""The pinned stack: environment.yml agrees with requirements.txt, and the installed stack is it."""

import importlib.metadata
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _pins(lines):
    pins = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        match = re.fullmatch(r"([A-Za-z0-9_.\-\[\]]+)==([^\s;]+)", line)
        if match:
            pins[match.group(1).lower()] = match.group(2)
        elif line:
            raise AssertionError(f"not an exact pin: {line!r}")
    return pins


def requirement_pins():
    return _pins((ROOT / "requirements.txt").read_text().splitlines())


def conda_pins():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert "python=3.11" in env["dependencies"]
    return _pins(pip_section)


def test_environment_yml_pins_the_same_versions_as_requirements():
    # Horovod is the one exception: it has to be compiled after TensorFlow, by `make setup`.
    expected = {k: v for k, v in requirement_pins().items() if k != "horovod"}
    assert conda_pins() == expected


def test_keras_2_is_pinned_beside_tensorflow_2_15():
    pins = requirement_pins()
    assert pins["tensorflow-cpu"] == "2.15.1" and pins["keras"].startswith("2.15.")
    assert pins["horovod"] == "0.28.1"


def test_the_installed_stack_is_the_pinned_one():
    for name, version in requirement_pins().items():
        assert importlib.metadata.version(name) == version, name
