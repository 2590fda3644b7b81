"""What a Slurm job array element runs on a cluster node: one submission's notebook, in the sandbox.

``python -m autograder.node_run TASK_FOLDER`` (started by :mod:`autograder.slurm`'s batch script, in
``python -I``) reads what the grader staged in the shared folder: ``task.json`` (papermill's
parameters, the time-out, the memory limit, whether to isolate, the folders to hide), the rebuilt
notebook and ``keep.npy`` (which training images this submission gets, in its order: the grader
chose them with the course secret, which never leaves the grader's machine). The data template
is the cohort's ``data/`` beside the tasks.

It then does on the node what the local backend does on the grader's machine: a run folder of its
own (:class:`autograder.isolation.RunFolder`, in the node's ``/tmp``), the data and the notebook in it,
:func:`autograder.sandbox.run_notebook` with the same limits and the same watchdog, and the facts
files read the same way. It hands everything back in ``result/``: the epoch files the watchdog
copied, the outcome's evidence files when the task names them (``result/evidence/``,
:func:`autograder.runners.copy_evidence`), and last ``result.json`` (the
:class:`~autograder.sandbox.RunResult`, the facts files and the node's name), written whole or not
at all. Measurement, the test cells' clean pass and nbgrader stay on the grader's machine.

A SIGTERM (``scancel``, or Slurm's time limit) stops the run at once and leaves nothing on the
node: the sandbox kills the run's processes and removes its cgroups before this program exits.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
from pathlib import Path

import nbformat
import numpy as np

from autograder import epochs, isolation, runners, safe_read, sandbox, stop

#: Prefix of the node's work folders (not the grader's ``mgpu-grade-``: on a machine that is both,
#: the grader's clean-up of its own stale folders must not take a running task's).
NODE_PREFIX = "mgpu-node-"


def _stop(signum, frame):  # SIGTERM -> an exception: the sandbox's finally blocks run
    raise SystemExit(128 + signum)


def _write_json_atomically(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def run_task(task_dir: Path) -> dict:
    """Run the task staged in ``task_dir``; write and return what ``result/result.json`` holds."""
    task_dir = Path(task_dir).resolve()
    task = json.loads((task_dir / "task.json").read_text())
    results = task_dir / "result"
    results.mkdir(exist_ok=True)
    from mgpu.runtime import data as data_mod

    hide = [Path(h) for h in task["hide"]] + [data_mod.cache_dir()]
    stop.cleanup_stale_runs()  # cgroups a runner Slurm killed outright left on this node
    work_root = Path(tempfile.mkdtemp(prefix=NODE_PREFIX))
    try:
        folder = isolation.RunFolder(work_root / "run")
        try:
            runners.write_run_data(task_dir.parent.parent / "data", np.load(task_dir / "keep.npy"), folder.data)
            name = task["notebook"]
            nbformat.write(nbformat.read(task_dir / name, as_version=4), folder.nb / name)
            parameters = dict(task["parameters"], data_dir=str(folder.data), output_dir=str(folder.output))
            run = sandbox.run_notebook(folder, name, parameters, keep=results, timeout_s=task["timeout_s"],
                                       memory_limit_mb=task["memory_limit_mb"], hide=hide, work_parent=work_root,
                                       isolate=task["isolate"])
            facts = safe_read.read_outputs(folder.output, runners.FACTS_PATTERN, runners.MAX_FACTS_BYTES,
                                           run.worker_uid)
            if task.get("evidence") is not None:  # the files the outcome reads, as the local backend copies them
                runners.copy_evidence(folder.output, tuple(task["evidence"]), results / "evidence", run.worker_uid)
        finally:
            folder.remove()
    finally:
        isolation.unmount_stale(work_root)
        shutil.rmtree(work_root, ignore_errors=True)
    record = {"run": run.to_json(), "node": socket.gethostname(), "slurm_node": os.environ.get("SLURMD_NODENAME", ""),
              "facts": {n: ({"rejected": str(d)} if isinstance(d, safe_read.Rejected)
                            else {"data": base64.b64encode(d).decode()}) for n, d in facts.items()}}
    _write_json_atomically(results / "result.json", record)
    return record


#: Largest result.json the grader reads (the executed notebook, at most 64 MB, and small facts).
MAX_RESULT_BYTES = sandbox.MAX_RESULT_BYTES + 2**20


def read_result(task_dir: Path, keep: Path) -> tuple[sandbox.RunResult, dict, dict] | None:
    """``(run, facts files, the record)`` from a finished task's ``result/``; None if it wrote none.

    The shared folder is read as hostile data, as a run's own folder is: no link is followed, no
    file larger than its cap is read, and each epoch file named in the record is copied into
    ``keep`` (a folder of the grader's) before anything reads it; an epoch file that cannot be
    taken is rejected with the reason. Raises ValueError when the record is not one this module
    writes."""
    results = Path(task_dir) / "result"
    try:
        folder_fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ValueError(f"{results} cannot be opened as a folder ({error.strerror})") from None
    try:
        try:
            record = json.loads(safe_read.read_regular(folder_fd, "result.json", MAX_RESULT_BYTES,
                                                       fix="the node's runner writes it"))
        except safe_read.Rejected as error:
            if not os.path.lexists(results / "result.json"):
                return None
            raise ValueError(str(error)) from None
        run = sandbox.RunResult.from_json(record["run"], keep)
        Path(keep).mkdir(parents=True, exist_ok=True)
        for epoch, copy in list(run.epoch_files.items()):
            try:
                copy.write_bytes(safe_read.read_regular(folder_fd, copy.name, epochs.MAX_EPOCH_BYTES))
            except safe_read.Rejected as error:
                del run.epoch_files[epoch]
                run.epoch_rejected[epoch] = str(error)
        facts = {name: (safe_read.Rejected(entry["rejected"]) if "rejected" in entry
                        else base64.b64decode(entry["data"], validate=True))
                 for name, entry in record["facts"].items()}
        return run, facts, record
    except (KeyError, TypeError, AttributeError, UnicodeDecodeError) as error:
        raise ValueError(f"{results / 'result.json'} is not a run's result ({type(error).__name__}: {error})") from None
    finally:
        os.close(folder_fd)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not (Path(args[0]) / "task.json").is_file():
        print("usage: python -m autograder.node_run TASK_FOLDER (a folder the grader staged, with task.json)",
              file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _stop)
    record = run_task(Path(args[0]))
    print(f"{record['slurm_node'] or record['node']}: {record['run']['status']} after "
          f"{record['run']['seconds']:.1f} s {record['run']['reason']}".rstrip())
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    raise SystemExit(main())
