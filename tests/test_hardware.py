"""The setup check's diagnosis: each problem is found and comes with its fix."""

from mgpu.runtime import hardware


def _machine(**changes):
    machine = hardware.Machine(
        cpu="test CPU", cores=2, memory_gib=8.0, gpus=[], python="3.11.7",
        versions={"TensorFlow": "2.15.1", "Keras": "2.15.0", "Horovod": "0.28.1"},
        horovod_built={"TensorFlow": True, "Gloo": True, "NCCL": False, "MPI": False},
    )
    for key, value in changes.items():
        setattr(machine, key, value)
    return machine


def test_a_good_cpu_machine_has_no_problems():
    assert hardware.problems(_machine(), "cpu", 4) == []


def test_keras_3_is_named_as_the_silent_all_reduce_breaker():
    found = hardware.problems(_machine(versions={"TensorFlow": "2.15.1", "Keras": "3.3.3",
                                                 "Horovod": "0.28.1"}), "cpu", 4)
    assert any("Keras 3" in p and "keras==2.15.0" in p for p in found)


def test_horovod_without_gloo_or_tensorflow():
    no_gloo = _machine(horovod_built={"TensorFlow": True, "Gloo": False})
    assert any("without Gloo" in p for p in hardware.problems(no_gloo, "cpu", 2))
    missing = _machine(horovod_built={}, versions={"TensorFlow": "2.15.1", "Keras": "2.15.0", "Horovod": None})
    found = hardware.problems(missing, "cpu", 2)
    assert any("Horovod is not installed" in p for p in found)
    assert all("make setup" in p for p in found)


def test_gpu_profile_needs_nccl_but_not_a_gpu_per_worker():
    gpu = _machine(gpus=["GPU:0", "GPU:1"])
    found = hardware.problems(gpu, "gpu", 4)
    assert any("without NCCL" in p for p in found)
    assert not any("workers" in p for p in found)  # 4 workers on 2 GPUs run on the CPU (mgpu.runtime.launch)


def test_wrong_python_is_reported():
    found = hardware.problems(_machine(python="3.10.12"), "cpu", 2)
    assert any("3.11 (pinned stack) or 3.12/3.13" in p for p in found)


def test_the_current_stack_is_good_on_python_3_12_and_3_13_and_not_on_3_11():
    current = {"TensorFlow": "2.20.0", "Keras": "2.20.1", "Horovod": "0.28.1"}
    for python in ("3.12.1", "3.13.0"):
        assert hardware.problems(_machine(python=python, versions=current), "cpu", 4) == []
    mixed = hardware.problems(_machine(python="3.11.7", versions=current), "cpu", 4)
    assert any("pinned stack pins 2.15.1" in p for p in mixed)


def test_on_colab_its_own_newer_tensorflow_is_kept_but_keras_3_is_not(monkeypatch):
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-test")
    newer = {"TensorFlow": "2.21.0", "Keras": "2.21.0", "Horovod": "0.28.1"}
    assert hardware.problems(_machine(python="3.13.0", versions=newer), "colab", 4) == []
    keras_3 = {"TensorFlow": "2.20.0", "Keras": "3.13.0", "Horovod": "0.28.1"}
    found = hardware.problems(_machine(python="3.13.0", versions=keras_3), "colab", 4)
    assert any("tf.keras is Keras 3" in p for p in found) and any("tf_keras 2.20.*" in p for p in found)


def test_this_machine_is_described_with_its_stack():
    machine = hardware.describe_machine()
    assert machine.cores >= 1 and machine.memory_gib > 0
    stack = hardware.STACKS[hardware.stack_for(machine.python)]
    assert (machine.versions["TensorFlow"], machine.versions["Keras"], machine.versions["Horovod"]) == \
        (stack["tensorflow"], stack["keras"], stack["horovod"])
    assert machine.horovod_built["TensorFlow"] and machine.horovod_built["Gloo"]
    assert hardware.detect_profile(machine) == ("gpu" if machine.gpus else "cpu")
