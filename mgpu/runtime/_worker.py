"""The program each Horovod worker runs for :mod:`mgpu.runtime.launch`.

It loads the job the launcher pickled, pins this worker's device, runs the function (or the
script as ``__main__``) and leaves a status file per rank, plus rank 0's return value, in the job
folder. A worker that is killed or crashes leaves no status: the launcher reports it as such.

The rank is the one the worker ends with: an elastic job deals the ranks anew when workers leave or
join, so the ``HOROVOD_RANK`` a worker was started with may by then be another worker's (a worker that
joins after a failure is started with a rank a survivor started with too).
"""

import json
import os
import runpy
import sys
import traceback
from pathlib import Path

import cloudpickle


def _write_json(path: Path, payload: dict) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # this process's own: never another's half-written file
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


def _final_rank(started_as: int) -> int:
    """This worker's Horovod rank now, if the job's function initialised Horovod; else the one it started with."""
    for name in ("horovod.tensorflow", "horovod.torch"):
        module = sys.modules.get(name)
        try:
            if module is not None and module.is_initialized():
                return int(module.rank())
        except (ValueError, RuntimeError):  # shut down by the function
            pass
    return started_as


def main(job_dir: str) -> int:
    job_path = Path(job_dir)
    rank = int(os.environ.get("HOROVOD_RANK", "0"))
    # The function may live in a module only the caller's import path reaches (a test file, a
    # notebook's folder): take that path first, then unpickle the job.
    sys_path_file = job_path / "sys_path.json"
    if sys_path_file.exists():
        sys.path[:0] = [p for p in json.loads(sys_path_file.read_text()) if p not in sys.path]
    with open(job_path / "job.pkl", "rb") as f:
        job = cloudpickle.load(f)

    from mgpu.runtime.launch import pin_gpu

    status, code = "ok", 0
    try:
        pin_gpu()
        if job["kind"] == "function":
            value = job["fn"](*job["args"], **job["kwargs"])
            rank = _final_rank(rank)
            if rank == 0:
                tmp = job_path / f"result.pkl.{os.getpid()}.tmp"
                with open(tmp, "wb") as f:
                    cloudpickle.dump(value, f)
                os.replace(tmp, job_path / "result.pkl")
        else:
            os.chdir(job["cwd"])
            sys.argv = list(job["argv"])
            sys.path.insert(0, str(Path(job["script"]).parent))
            try:
                runpy.run_path(job["script"], run_name="__main__")
            except SystemExit as exit_:
                if exit_.code not in (None, 0):
                    code = exit_.code if isinstance(exit_.code, int) else 1
                    status = f"exited with status {exit_.code}"
    except BaseException as error:  # noqa: BLE001 - report anything, then fail the rank
        traceback.print_exc()
        status, code = f"{type(error).__name__}: {error}".splitlines()[0][:500], 1
    rank = _final_rank(rank)
    _write_json(job_path / f"status-{rank}.json", {"status": status})
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
