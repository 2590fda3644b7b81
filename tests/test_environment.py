"""The two stacks: environment.yml agrees with requirements.txt, requirements-current.txt pins a
Keras 2 (tf_keras) of TensorFlow's own version, hardware.STACKS agrees with both files, and the
installed stack is the one for this Python."""

import importlib.metadata
import platform
import re
from pathlib import Path

import yaml

from mgpu.runtime import hardware

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


def requirement_pins(name="requirements.txt"):
    return _pins((ROOT / name).read_text().splitlines())


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


def test_the_current_stack_pins_tf_keras_of_tensorflows_version_and_the_same_horovod():
    pins = requirement_pins("requirements-current.txt")
    assert pins["tensorflow"].split(".")[:2] == pins["tf_keras"].split(".")[:2]
    assert int(pins["tensorflow"].split(".")[1]) >= 16 and "keras" not in pins
    assert pins["horovod"] == requirement_pins()["horovod"]


def test_hardware_stacks_agree_with_the_requirement_files():
    for stack, name, tensorflow, keras in (("pinned", "requirements.txt", "tensorflow-cpu", "keras"),
                                           ("current", "requirements-current.txt", "tensorflow", "tf_keras")):
        pins, want = requirement_pins(name), hardware.STACKS[stack]
        assert (pins[tensorflow], pins[keras], pins["horovod"]) == \
            (want["tensorflow"], want["keras"], want["horovod"]), stack


def test_the_installed_stack_is_the_one_for_this_python():
    stack = hardware.stack_for(platform.python_version())
    pins = requirement_pins("requirements.txt" if stack == "pinned" else "requirements-current.txt")
    if hardware.in_colab():  # Colab keeps its own TensorFlow, tf_keras, numpy and plotting libraries
        from mgpu.runtime import colab

        pins = {k: v for k, v in pins.items() if k not in colab.COLAB_PROVIDES or k == "horovod"}
    for name, version in pins.items():
        assert importlib.metadata.version(name.split("[")[0]) == version, name
