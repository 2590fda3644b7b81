"""The system-call filter of every run (autograder/syscall_filter.py): each denied call fails inside a
real run (the sandbox's namespaces, the run's user), and what honest code needs still works."""

import errno
import json
import sys
import textwrap
from pathlib import Path

import pytest

from autograder import isolation, sandbox, syscall_filter

pytestmark = pytest.mark.slow

#: Each denied call with arguments that would not fail with the filter's errno without it (or would
#: succeed: every call runs in a child of its own, so one that got through changes nothing else).
CALLS = {
    "unshare": (0x10000000,),                   # CLONE_NEWUSER: `unshare -Ur` (root in a user namespace)
    "clone": (0x10000000 | 17, 0, 0, 0, 0),     # CLONE_NEWUSER | SIGCHLD
    "clone (CLONE_NEWNET)": (0x40000000 | 17, 0, 0, 0, 0),
    "clone (CLONE_NEWNS)": (0x00020000 | 17, 0, 0, 0, 0),
    "clone (CLONE_NEWPID)": (0x20000000 | 17, 0, 0, 0, 0),
    "setns": (-1, 0),
    "mount": (0, 0, 0, 0, 0),
    "umount2": (0, 0),
    "pivot_root": (0, 0),
    "ptrace": (0,),                              # PTRACE_TRACEME
    "process_vm_readv": ("self", 0, 0, 0, 0, 0),
    "process_vm_writev": ("self", 0, 0, 0, 0, 0),
    "bpf": (0, 0, 0),
    "perf_event_open": (0, 0, -1, -1, 0),
    "keyctl": (0, -3, 0),                        # KEYCTL_GET_KEYRING_ID of the session keyring
    "add_key": (0, 0, 0, 0, 0),
    "request_key": (0, 0, 0, 0),
    "userfaultfd": (0,),
    "kexec_load": (0, 0, 0, 0),
    "kexec_file_load": (-1, -1, 0, 0, 0),
    "init_module": (0, 0, 0),
    "finit_module": (-1, 0, 0),
    "delete_module": (0, 0),
    "personality": (0x0040000,),                 # ADDR_NO_RANDOMIZE
    "io_uring_setup": (1, 0),
    "io_uring_enter": (-1, 0, 0, 0, 0, 0),
    "io_uring_register": (-1, 0, 0, 0),
    "fsopen": (0, 0),
    "open_tree": (-1, 0, 0),
}
#: Calls that honest code makes, and must keep working.
ALLOWED = {
    "personality (read)": ("personality", (0xFFFFFFFF,)),
    "clone (a plain fork)": ("clone", (17, 0, 0, 0, 0)),
}

PROBE = """
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
results = {}
for label, (number, args) in json.loads(sys.argv[1]).items():
    args = [os.getpid() if a == "self" else a for a in args]
    pid = os.fork()
    if pid == 0:
        code = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) for a in args])
        os._exit(0 if code >= 0 else min(ctypes.get_errno(), 255))
    _, status = os.waitpid(pid, 0)
    results[label] = os.waitstatus_to_exitcode(status)
results["seccomp"] = [line.split()[1] for line in open("/proc/self/status") if line.startswith("Seccomp:")][0]
print(json.dumps(results))
"""


def _probe(tmp_path: Path, refuse_errno: int) -> dict:
    calls = {**{label: (label.split()[0], args) for label, args in CALLS.items()}, **ALLOWED, "clone3": ("clone3", (0, 0))}
    numbers = {label: (syscall_filter.syscall_number(name), args) for label, (name, args) in calls.items()
               if syscall_filter.syscall_number(name) is not None}
    work = tmp_path / f"runs-{refuse_errno}" / "work"
    work.mkdir(parents=True)
    (work / "probe.py").write_text(PROBE)
    saved = isolation.FILTER_ERRNO
    isolation.FILTER_ERRNO = refuse_errno
    try:
        code, out, err = sandbox.run_isolated([isolation.PYTHON, "-I", str(work / "probe.py"), json.dumps(numbers)],
                                              work, cwd=work, timeout_s=120, env={"PATH": "/usr/bin:/bin"},
                                              work_parent=work.parent)
    finally:
        isolation.FILTER_ERRNO = saved
    assert code == 0, (out, err)
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    available, why = isolation.isolation_available()
    if not available:
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("filter")
    # A distinctive errno shows the filter refused the call (the run's user alone would get EPERM
    # for some of them), then the grader's own errno, EPERM.
    return {"marked": _probe(folder, errno.ENOTRECOVERABLE), "graded": _probe(folder, errno.EPERM)}


@pytest.mark.parametrize("label", sorted(CALLS))
def test_the_call_is_refused_inside_a_run(probed, label):
    if label not in probed["graded"]:
        pytest.skip(f"{label} does not exist on this architecture")
    assert probed["marked"][label] == errno.ENOTRECOVERABLE, probed["marked"]
    assert probed["graded"][label] == errno.EPERM, probed["graded"]


def test_clone3_is_not_implemented_so_the_c_library_falls_back_to_clone(probed):
    assert probed["graded"]["clone3"] == errno.ENOSYS


@pytest.mark.parametrize("label", sorted(ALLOWED))
def test_what_honest_code_needs_still_works(probed, label):
    assert probed["graded"][label] == 0, probed["graded"]


def test_the_run_works_under_the_filter(probed):
    assert probed["graded"]["seccomp"] == "2"


def test_the_helper_loads_the_filter_and_every_child_inherits_it():
    """Outside any sandbox: the helper loads the filter and runs a command under it."""
    import subprocess
    done = subprocess.run([sys.executable, "-I", str(Path(syscall_filter.__file__)), "--", sys.executable, "-c",
                           textwrap.dedent("""
                               import os, subprocess, threading
                               print(open("/proc/self/status").read().count("Seccomp:\\t2"))
                               print(subprocess.run(["echo", "child"], capture_output=True, text=True).stdout.strip())
                               thread = threading.Thread(target=print, args=("thread",)); thread.start(); thread.join()
                               done = subprocess.run(["unshare", "-Ur", "true"], capture_output=True, text=True)
                               print("unshare", done.returncode, "Operation not permitted" in done.stderr)
                           """)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split()
    assert lines[:3] == ["1", "child", "thread"], done.stdout
    assert lines[3:] == ["unshare", "1", "True"], done.stdout  # a child's `unshare -Ur` is refused


def test_without_libseccomp_the_grader_says_so(monkeypatch):
    monkeypatch.setattr(syscall_filter, "LIBSECCOMP", "libseccomp-missing.so.9")
    import ctypes.util
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    isolation.filter_available.cache_clear()
    try:
        ok, note = isolation.isolation_available()
        assert not ok and note.count("\n") == 0
        assert "libseccomp not found: install it (apt-get install libseccomp2)" in note
        assert "without a system-call filter" in note
    finally:
        isolation.filter_available.cache_clear()
