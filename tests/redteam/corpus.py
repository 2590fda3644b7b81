"""The red-team corpus: submissions that try to break or fool the grader, with the verdict each must get.

Every case is built from the course's own source (reference solution) and release notebooks, so
the corpus follows every change to the assessment. :data:`CASES` lists them with the verdict
(pass or fail) and the words the reasons must contain; ``test_redteam.py`` grades them all as one
cohort with real kernels and real Horovod workers and checks each verdict, the gradebook, the
files around the run and the processes left.

Three programs the cases start from:

- ``reference``: the source notebook (converted, trains to the target);
- ``quick``: the reference trained for 1 epoch (a correct Horovod conversion whose accuracy stays
  under the target: its tests pass and its outcome fails, in about 20 s);
- ``unconverted_quick``: the released single-process program, 1 epoch.

The demonstration cohort (``autograder/cohort.py``: reference, unconverted, crashing, infinite
loop, fake accuracy with an edited outcome cell) is graded by ``test_autograder_cohort.py`` and
is part of the corpus too; its cases are not repeated here.
"""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import nbformat

PROGRAM = "training_program"


@dataclass
class Context:
    """What the builders need: the course folder and weights leaked from a run outside the grader."""

    course_dir: Path
    leaked_weights_b64: str = ""

    def notebook(self, kind: str):
        folder = "source" if kind in ("reference", "quick") else "release"
        notebook = nbformat.read(self.course_dir / folder / "assessment" / "assessment.ipynb", as_version=4)
        if kind == "quick":
            _edit(notebook, PROGRAM, "epochs = 12\n", "epochs = 1\n")
        elif kind == "unconverted_quick":
            _edit(notebook, PROGRAM, "epochs = 5\n", "epochs = 1\n")
        return notebook


@dataclass
class Case:
    name: str
    build: Callable[[Context], object]   # a notebook, or the raw bytes of the submitted file
    passes: bool
    words: tuple[str, ...]               # every one must appear in the verdict's reasons (or notes)
    what: str                            # the attack, in one line (the verdicts table)


def cell(notebook, grade_id: str):
    for c in notebook.cells:
        if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            return c
    raise KeyError(grade_id)


def _edit(notebook, grade_id: str, old: str, new: str) -> None:
    target = cell(notebook, grade_id)
    if old not in target.source:
        raise ValueError(f"{grade_id} no longer contains {old!r}: update tests/redteam/corpus.py")
    target.source = target.source.replace(old, new, 1)


def _prepend(notebook, code: str, kind_cell: str = PROGRAM) -> None:
    target = cell(notebook, kind_cell)
    target.source = code.rstrip() + "\n\n" + target.source


# A program that only attacks: train() saves nothing, so the verdict is a plain fail.
_ATTACK_ONLY_TRAIN = '''

def train():
    return {"val_accuracy": [0.0]}
'''


def _attack_only(context: Context, attack: str):
    notebook = context.notebook("unconverted_quick")
    cell(notebook, PROGRAM).source = attack.rstrip() + "\n" + _ATTACK_ONLY_TRAIN
    return notebook


# ----------------------------------------------------------------------------- the notebook file

def malformed_json(context):
    return b'{"cells": [{"cell_type": "code", "source": "print(1)"'


def notebook_200mb(context):
    notebook = context.notebook("quick")
    cell(notebook, PROGRAM).outputs = [nbformat.v4.new_output("stream", name="stdout", text="x" * (200 * 2**20))]
    return nbformat.writes(notebook).encode()


def student_cell_missing(context):
    notebook = context.notebook("quick")
    notebook.cells = [c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") != PROGRAM]
    return notebook


def student_cell_twice(context):
    notebook = context.notebook("quick")
    index = notebook.cells.index(cell(notebook, PROGRAM))
    notebook.cells.insert(index, nbformat.from_dict(notebook.cells[index]))
    return notebook


def grade_id_renamed(context):
    notebook = context.notebook("quick")
    cell(notebook, PROGRAM).metadata.nbgrader["grade_id"] = "my_program"
    return notebook


def locked_cells_missing(context):
    notebook = context.notebook("reference")
    drop = {"test_horovod_init", "test_distributed_training", "outcome", "setup"}
    notebook.cells = [c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") not in drop]
    return notebook


def cells_reordered(context):
    notebook = context.notebook("reference")
    notebook.cells = list(reversed(notebook.cells))
    notebook.cells.append(nbformat.v4.new_code_cell("print('a cell the student added')"))
    return notebook


def cell_type_changed(context):
    notebook = context.notebook("quick")
    run = cell(notebook, "run_training")
    index = notebook.cells.index(run)
    notebook.cells[index] = nbformat.v4.new_markdown_cell(run.source, metadata=run.metadata)
    return notebook


def locked_cell_edited(context):
    notebook = context.notebook("quick")
    _edit(notebook, "setup", "    return assessment.protected_callbacks(output_dir, target_accuracy, time_budget_s)",
          "    return []  # no facts, no stop rule, no budget, no weights")
    return notebook


def test_cell_edited(context):
    notebook = context.notebook("unconverted_quick")
    cell(notebook, "test_horovod_init").source = "pass  # nothing to test"
    cell(notebook, "test_distributed_training").source = "assert True"
    return notebook


def nbgrader_metadata_edited(context):
    notebook = context.notebook("quick")
    cell(notebook, "test_horovod_init").metadata.nbgrader["points"] = 100
    cell(notebook, "outcome").metadata.nbgrader["grade"] = False
    cell(notebook, "run_training").metadata.nbgrader["locked"] = False
    return notebook


# ------------------------------------------------------------------------------------ the kernel

def kernel_os_exit(context):
    notebook = context.notebook("quick")
    _prepend(notebook, "import os\nos._exit(3)")
    return notebook


def kernel_segfault(context):
    notebook = context.notebook("quick")
    _prepend(notebook, "import ctypes\nctypes.string_at(0)")
    return notebook


def memory_bomb(context):
    notebook = context.notebook("quick")
    _prepend(notebook, "blocks = []\nwhile True:\n    blocks.append(bytearray(2**28))")
    return notebook


def fork_bomb(context):
    notebook = context.notebook("quick")
    _prepend(notebook, "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass")
    return notebook


def worker_hangs_in_allreduce(context):
    notebook = context.notebook("reference")
    _edit(notebook, PROGRAM, "    history = model.fit(",
          "    import time\n\n"
          "    class Hang(tf.keras.callbacks.Callback):\n"
          "        def on_epoch_end(self, epoch, logs=None):\n"
          "            if rank == 1:\n"
          "                time.sleep(10**6)  # rank 0 waits for it in the next all-reduce\n\n"
          "    callbacks.append(Hang())\n"
          "    history = model.fit(")
    return notebook


# ----------------------------------------------------------------------------------- cheating

def fake_results_and_output(context):
    notebook = context.notebook("quick")
    _edit(notebook, PROGRAM, "    return {name:",
          "    import json, os\n"
          "    os.makedirs('build/results', exist_ok=True)\n"
          "    for path in ('results.json', 'build/results/assessment.json', os.path.join(output_dir, 'accuracy.json')):\n"
          "        json.dump({'accuracy': 0.99, 'passed': True}, open(path, 'w'))\n"
          "    print('Epoch 2: val_accuracy: 0.9900 PASSED')\n"
          "    return {name:")
    return notebook


def fake_weights_files(context):
    return _attack_only(context, '''
import os
import numpy as np

os.makedirs(output_dir, exist_ok=True)
np.save(os.path.join(output_dir, "evil.npy"), np.array([{"a": 1}], dtype=object), allow_pickle=True)
with open(os.path.join(output_dir, "epoch_000.npz"), "wb") as f:  # a pickled object array
    np.savez(f, np.array([{"weights": 1}], dtype=object))
os.symlink("/dev/zero", os.path.join(output_dir, "epoch_001.npz"))   # an endless read
os.symlink("/etc/passwd", os.path.join(output_dir, "epoch_002.npz"))
np.savez(os.path.join(output_dir, "epoch_003.npz"), np.zeros((3, 3)))  # another architecture
with open(os.path.join(output_dir, "epoch_004.npz"), "wb") as f:
    f.write(b"PK\\x03\\x04" + os.urandom(4096))  # not a zip
''')


_COPIER = '''
    # Copied: weights from somebody else's run, written over this run's epochs.
    if rank == 0:
        import base64, io, os
        leaked = np.load(io.BytesIO(base64.b64decode(LEAKED)), allow_pickle=False)
        weights = [leaked[f"arr_{i}"] for i in range(len(leaked.files))]
        for epoch in (0, 1):
            assessment.save_weights_atomically(weights, os.path.join(output_dir, f"epoch_{epoch:03d}.npz"))
    return {name:'''


def copied_weights(context):
    notebook = context.notebook("quick")
    _prepend(notebook, f'import numpy as np\nLEAKED = "{context.leaked_weights_b64}"')
    _edit(notebook, PROGRAM, "    return {name:", _COPIER)
    _edit(notebook, PROGRAM, "    from mgpu import assessment\n", "    from mgpu import assessment\n    import numpy as np\n")
    return notebook


def test_split_reached_for(context):
    notebook = context.notebook("quick")
    _prepend(notebook, '''
import os
from mgpu import data, paths, synthetic
print("data folder holds:", sorted(os.listdir(data_dir)))
print("data cache visible:", sorted(os.listdir(paths.ROOT / "data" / "cache")) if (paths.ROOT / "data" / "cache").exists() else [])
try:
    data.load("fashion_mnist", verbose=False)
    print("fashion_mnist: loaded")
except Exception as error:
    print("fashion_mnist: unavailable:", type(error).__name__)
# The generated task's public test split can be regenerated by anyone; train on it too.
_, _, x_public_test, y_public_test = synthetic.generate(0, n_train=0, n_test=10000)
print("regenerated public test split:", x_public_test.shape)
''')
    _edit(notebook, PROGRAM, "    x, y, x_val, y_val, info = assessment.load_data(data_dir)\n",
          "    x, y, x_val, y_val, info = assessment.load_data(data_dir)\n"
          "    import numpy as np\n"
          "    from mgpu import synthetic\n"
          "    _, _, xt, yt = synthetic.generate(0, n_train=0, n_test=10000)\n"
          "    x, y = np.concatenate([x, xt]), np.concatenate([y, yt])\n")
    return notebook


def monkeypatched_tests_and_assert(context):
    notebook = context.notebook("unconverted_quick")
    _prepend(notebook, '''
from mgpu import assessment
# Every test reads the facts: make them say what the tests want.
assessment.read_run_facts = lambda folder: assessment.Facts(processes=workers, horovod_sizes=[workers] * workers,
                                                           distributed_optimizer=True, weights_in_sync=True,
                                                           epochs_done=1)
# And swallow any exception a test cell still raises (no error output: nbgrader would give full marks).
get_ipython().set_custom_exc((BaseException,), lambda shell, etype, evalue, tb, tb_offset=None: None)
import builtins
builtins.AssertionError = type("AssertionError", (Exception,), {})
''')
    return notebook


def fake_facts_files(context):
    notebook = context.notebook("unconverted_quick")
    _prepend(notebook, '''
import json, os
os.makedirs(output_dir, exist_ok=True)
for pid, rank in ((424242, 0), (424243, 1)):
    json.dump({"pid": pid, "rank": rank, "horovod_size": workers, "distributed_optimizer": True,
               "steps_per_epoch": 10, "epochs_done": 3, "weights_in_sync": True},
              open(os.path.join(output_dir, f"facts-{pid}.json"), "w"))
''')
    return notebook


def parameters_changed(context):
    notebook = context.notebook("quick")
    _prepend(notebook, "workers = 1\ntarget_accuracy = 0.1\ntime_budget_s = 1e9")
    return notebook


def outside_the_work_folder(context):
    root = context.course_dir
    targets = {
        "gradebook": root / "gradebook.db",
        "solution": root / "source" / "assessment" / "assessment.ipynb",
        "other student": root / "submitted" / "cells_reordered" / "assessment" / "assessment.ipynb",
        "signing key": root / ".keys" / "signing_key.pem",
        "grading secret": root / ".keys" / "grading_secret",
        "records": root / "autograder" / "assessment",
    }
    return _attack_only(context, f'''
import glob, os
targets = {{k: v for k, v in {json.dumps({k: str(v) for k, v in targets.items()})}.items()}}
for name, path in targets.items():
    try:
        if os.path.isdir(path):
            found = os.listdir(path)
            print(f"READ {{name}}: listed {{found}}" if found else f"blocked {{name}}: empty")
        else:
            data = open(path, "rb").read()
            print(f"READ {{name}}: {{len(data)}} bytes")
    except OSError as error:
        print(f"blocked {{name}}: {{type(error).__name__}}")
    try:
        target = path if not os.path.isdir(path) else os.path.join(path, "planted.json")
        with open(target, "ab") as f:
            f.write(b"tampered")
        print(f"WROTE {{name}}")
    except OSError as error:
        print(f"blocked writing {{name}}: {{type(error).__name__}}")
print("other work folders:", sorted(os.listdir("..")))
print("processes visible:", len([p for p in os.listdir("/proc") if p.isdigit()]))
print("running as uid", os.getuid())
# Undo the mounts that hide the course, then look again.
import subprocess
undone = subprocess.run(["umount", "-l", os.path.dirname(targets["gradebook"])], capture_output=True, text=True)
print("umount:", "done" if undone.returncode == 0 else "refused")
try:
    open(targets["gradebook"], "rb").read()
    print("READ gradebook after umount")
except OSError as error:
    print(f"blocked gradebook after umount: {{type(error).__name__}}")
''')


def network(context):
    return _attack_only(context, '''
import socket, urllib.request
for host, port in (("pypi.org", 443), ("8.8.8.8", 53), ("1.1.1.1", 80)):
    try:
        socket.create_connection((host, port), timeout=5).close()
        print(f"CONNECTED {host}:{port}")
    except OSError as error:
        print(f"blocked {host}:{port}: {type(error).__name__}")
try:
    urllib.request.urlopen("https://storage.googleapis.com/tensorflow/tf-keras-datasets/t10k-labels-idx1-ubyte.gz", timeout=5)
    print("DOWNLOADED the test labels")
except Exception as error:
    print(f"blocked download: {type(error).__name__}")
''')


CASES: list[Case] = [
    Case("malformed_json", malformed_json, False, ("rejected: not a well-formed notebook (invalid JSON",),
         "truncated JSON"),
    Case("notebook_200mb", notebook_200mb, False, ("rejected: notebook is 200.", "MB limit"),
         "a 200 MB notebook (one huge output)"),
    Case("student_cell_missing", student_cell_missing, False,
         ("rejected: cells missing from the notebook: training_program",), "the student's own cell deleted"),
    Case("student_cell_twice", student_cell_twice, False, ("rejected: 2 cells are marked training_program",),
         "the student's cell duplicated"),
    Case("grade_id_renamed", grade_id_renamed, False, ("rejected: cells missing from the notebook: training_program",),
         "nbgrader grade_id of the student's cell edited"),
    Case("locked_cells_missing", locked_cells_missing, True,
         ("locked cell modified: restored (", "setup", "test_horovod_init", "outcome"),
         "setup, both test cells and the outcome cell deleted (reference program)"),
    Case("cells_reordered", cells_reordered, True, ("cells reordered: graded in the released order",
                                                    "1 code cell(s) you added were not run"),
         "every cell in reverse order, one cell added (reference program)"),
    Case("cell_type_changed", cell_type_changed, False,
         ("locked cell modified: restored (run_training)", "< 0.800 target"),
         "the locked run_training cell turned into markdown (1-epoch program)"),
    Case("locked_cell_edited", locked_cell_edited, False, ("locked cell modified: restored (setup)", "< 0.800 target"),
         "protected_callbacks() edited to return no callbacks (1-epoch program)"),
    Case("test_cell_edited", test_cell_edited, False,
         ("locked cell modified: restored (test_horovod_init, test_distributed_training)",
          "test test_horovod_init failed", "hvd.size()"), "both test cells replaced by pass (unconverted)"),
    Case("nbgrader_metadata_edited", nbgrader_metadata_edited, False,
         ("locked cell modified: restored (", "run_training", "test_horovod_init", "outcome"),
         "points 2 -> 100, outcome ungraded, run_training unlocked (1-epoch program)"),
    Case("kernel_os_exit", kernel_os_exit, False, ("kernel died",), "os._exit(3) in the kernel"),
    Case("kernel_segfault", kernel_segfault, False, ("kernel died",), "a segmentation fault in the kernel"),
    Case("memory_bomb", memory_bomb, False, ("memory limit exceeded",), "256 MB more every iteration, forever"),
    Case("fork_bomb", fork_bomb, False, ("too many processes",), "os.fork() forever"),
    Case("worker_hangs_in_allreduce", worker_hangs_in_allreduce, False, ("timed out after",),
         "rank 1 sleeps after epoch 1 while rank 0 waits in the all-reduce"),
    Case("fake_results_and_output", fake_results_and_output, False, ("< 0.800 target",),
         "prints 0.99 and writes results files claiming a pass (1-epoch program)"),
    Case("fake_weights_files", fake_weights_files, False,
         ("every saved epoch was rejected", "no training process reported"),
         "pickled, symlinked (/dev/zero, /etc/passwd), wrong-shape and corrupt epoch files"),
    Case("copied_weights_a", copied_weights, False, ("copied weights", "copied_weights_b"),
         "a real 1-epoch Horovod run whose epoch files are overwritten with leaked weights"),
    Case("copied_weights_b", copied_weights, False, ("copied weights", "copied_weights_a"),
         "a second student with the same leaked weights"),
    Case("test_split_reached_for", test_split_reached_for, False, ("0.800 target",),
         "looks for the data cache and Fashion-MNIST, trains on the regenerated public test split"),
    Case("monkeypatched_tests_and_assert", monkeypatched_tests_and_assert, False,
         ("test test_horovod_init failed", "hvd.size()"),
         "read_run_facts replaced, exceptions swallowed, AssertionError replaced (unconverted)"),
    Case("fake_facts_files", fake_facts_files, False, ("test test_horovod_init failed", "hvd.size()"),
         "facts files claiming 2 Horovod workers written from the kernel (unconverted)"),
    Case("parameters_changed", parameters_changed, False,
         ("saw 1 Horovod worker(s)", "test test_horovod_init failed", "< 0.800 target"),
         "workers = 1, target 0.1 and an endless budget set in the student's cell"),
    Case("outside_the_work_folder", outside_the_work_folder, False, ("no weights saved",),
         "reads and writes the gradebook, the solution, another student, the signing key, the secret"),
    Case("network", network, False, ("no weights saved",), "connects out and downloads the test labels"),
]


def leaked_weights(course_dir: Path) -> str:
    """Weights trained outside the grader (as a student would share them): base64 of an .npz."""
    import numpy as np
    import tensorflow as tf

    from mgpu import assessment

    folder = course_dir.parent / f"{course_dir.name}-leak"
    assessment.prepare_practice_data(folder)
    x, y, x_val, y_val, info = assessment.load_data(folder)
    tf.keras.utils.set_random_seed(1)
    model = assessment.reference_model(info["image_shape"], info["num_classes"], seed=1)
    model.compile(optimizer=tf.keras.optimizers.SGD(0.04, momentum=0.9),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(x, y, batch_size=128, epochs=6, verbose=0)
    buffer = io.BytesIO()
    np.savez(buffer, *model.get_weights())
    return base64.b64encode(buffer.getvalue()).decode()


def write_corpus(context: Context) -> list[str]:
    """Write every case into ``submitted/<case>/assessment/assessment.ipynb``; returns the names."""
    for case in CASES:
        folder = context.course_dir / "submitted" / case.name / "assessment"
        folder.mkdir(parents=True, exist_ok=True)
        built = case.build(context)
        path = folder / "assessment.ipynb"
        if isinstance(built, bytes):
            path.write_bytes(built)
        else:
            nbformat.write(built, path)
    return [case.name for case in CASES]

BY_NAME: dict[str, Case] = {case.name: case for case in CASES}
