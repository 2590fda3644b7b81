"""The setup check's diagnosis: each problem is found and comes with its fix."""

from mgpu import hardware


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


def test_gpu_profile_needs_nccl_and_enough_gpus():
    gpu = _machine(gpus=["GPU:0", "GPU:1"])
    found = hardware.problems(gpu, "gpu", 4)
    assert any("without NCCL" in p for p in found)
    assert any("use workers=2" in p for p in found)


def test_wrong_python_is_reported():
    assert any("needs 3.11" in p for p in hardware.problems(_machine(python="3.12.1"), "cpu", 2))


def test_this_machine_is_described_with_the_pinned_stack():
    machine = hardware.describe_machine()
    assert machine.cores >= 1 and machine.memory_gib > 0
    assert machine.versions["Horovod"] == hardware.PINNED["horovod"]
    assert machine.horovod_built["TensorFlow"] and machine.horovod_built["Gloo"]
    assert hardware.detect_profile(machine) == ("gpu" if machine.gpus else "cpu")
