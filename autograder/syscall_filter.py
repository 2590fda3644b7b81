"""The system-call filter every run works under (seccomp, compiled by libseccomp).

A run's processes (the student's kernel, the launch service and the Horovod workers it starts, the
clean test pass) cannot make namespaces, mount, trace or read other processes' memory, load BPF
programs or kernel modules, open perf events or io_uring, use the kernel's keyrings,
``userfaultfd``, ``kexec``, or change their personality: each such call fails with ``EPERM``
(:data:`DENIED`). ``clone`` is refused only with a namespace flag; ``clone3``, whose flags sit in
a struct a filter cannot read, fails with ``ENOSYS``, so the C library falls back to ``clone``.

The filter is compiled by libseccomp (the library Docker's, systemd's and nsjail's filters are
built with), called through ``ctypes``: no hand-written BPF and no Python package beyond the
standard library. The sandbox runs this file as a program (``python -I -S syscall_filter.py
[--errno N] -- COMMAND...``) after its own namespaces and mounts are set up and just before the
command: it sets ``no_new_privs``, loads the filter and ``exec``s the command, whose every child
inherits it. It imports nothing but the standard library (``-I`` puts no folder on the import path).
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

#: Refused whatever their arguments.
DENIED = (
    "unshare", "setns",                                              # namespaces
    "mount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount",
    "open_tree", "mount_setattr",                                    # mounts (old and new API)
    "ptrace", "process_vm_readv", "process_vm_writev",               # other processes' memory
    "bpf", "perf_event_open",
    "keyctl", "add_key", "request_key",
    "userfaultfd",
    "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
)
#: ``clone`` with any of these flags is refused (CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER,
#: NEWPID, NEWNET).
CLONE_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
#: ``personality`` may only be read (``personality(0xffffffff)``), never changed.
PERSONALITY_QUERY = 0xFFFFFFFF
#: Calls answered ENOSYS ("not implemented") so that the C library falls back to one it can filter.
NOT_IMPLEMENTED = ("clone3",)
LIBSECCOMP = "libseccomp.so.2"

_ALLOW = 0x7FFF0000
_CMP_NE, _CMP_MASKED_EQ = 1, 7


def _errno_action(number: int) -> int:
    return 0x00050000 | (number & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


class FilterError(Exception):
    """The filter cannot be built or loaded here (one line saying why)."""


def _library():
    if not sys.platform.startswith("linux"):
        raise FilterError(f"no system-call filter on {sys.platform}: seccomp is Linux's")
    try:  # by its usual name first: find_library runs ldconfig, which takes time
        lib = ctypes.CDLL(LIBSECCOMP, use_errno=True)
    except OSError:
        try:
            from ctypes import util  # (only here: it imports much of the standard library)
            lib = ctypes.CDLL(util.find_library("seccomp") or LIBSECCOMP, use_errno=True)
        except OSError:
            raise FilterError("libseccomp not found: install it (apt-get install libseccomp2)") from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


def syscall_number(name: str) -> int | None:
    """The number of system call ``name`` on this machine's architecture (None if it has none)."""
    number = _library().seccomp_syscall_resolve_name(name.encode())
    return None if number < 0 else number


def _build(lib, refuse_errno: int):
    ctx = lib.seccomp_init(_ALLOW)
    if not ctx:
        raise FilterError("libseccomp could not start a filter")

    def rule(action: int, name: str, *comparisons: tuple[int, int, int, int]) -> None:
        number = lib.seccomp_syscall_resolve_name(name.encode())
        if number < 0:  # not a call of this architecture (e.g. a newer kernel's)
            return
        array = (_ArgCmp * max(len(comparisons), 1))(*[_ArgCmp(*c) for c in comparisons])
        code = lib.seccomp_rule_add_array(ctx, action, number, len(comparisons), array)
        if code < 0:
            lib.seccomp_release(ctx)
            raise FilterError(f"libseccomp refused the rule for {name} ({os.strerror(-code)})")

    refuse = _errno_action(refuse_errno)
    for name in DENIED:
        rule(refuse, name)
    for flag in CLONE_NAMESPACE_FLAGS:
        rule(refuse, "clone", (0, _CMP_MASKED_EQ, flag, flag))
    rule(refuse, "personality", (0, _CMP_NE, PERSONALITY_QUERY, 0))
    for name in NOT_IMPLEMENTED:
        rule(_errno_action(errno.ENOSYS), name)
    return ctx


def check(refuse_errno: int = errno.EPERM) -> None:
    """Build the filter without loading it; raises :class:`FilterError` when it cannot be."""
    lib = _library()
    lib.seccomp_release(_build(lib, refuse_errno))


def install(refuse_errno: int = errno.EPERM) -> None:
    """Set ``no_new_privs`` and load the filter into this process (and so into all it starts)."""
    lib = _library()
    ctx = _build(lib, refuse_errno)
    try:
        code = lib.seccomp_load(ctx)
    finally:
        lib.seccomp_release(ctx)
    if code < 0:
        raise FilterError(f"the kernel refused the system-call filter ({os.strerror(-code)})")


def main(argv: list[str]) -> int:
    refuse_errno = errno.EPERM
    if argv[:1] == ["--errno"]:
        refuse_errno, argv = int(argv[1]), argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: syscall_filter.py [--errno N] -- COMMAND...", file=sys.stderr)
        return 2
    try:
        install(refuse_errno)
    except FilterError as error:
        print(f"sandbox: {error}: the run does not start", file=sys.stderr)
        return 126
    try:
        os.execvp(argv[0], argv)
    except OSError as error:
        print(f"sandbox: cannot run {argv[0]}: {error.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
