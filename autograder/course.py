"""The nbgrader course the grader works on: release, submissions, locked cells, autograde, feedback.

Everything goes through nbgrader's own API (:class:`nbgrader.apps.NbGraderAPI`, its gradebook and
its preprocessors). The course folder holds ``nbgrader_config.py``, ``source/<assignment>/``,
``gradebook.db`` and the student submissions in ``submitted/<student>/<assignment>/``; the grader
adds ``executed/`` (each submission as it ran: locked cells restored, parameters injected, outputs,
the measured outcome), which it hands to ``autograde`` in place of ``submitted/`` so the students'
files are never modified.

Autograde runs with nbgrader's execution switched off, because the grader executed the notebook
itself under its own limits. nbgrader would then give full marks to a test cell that never ran
(it scores a code cell by looking for an error in its outputs), so :func:`mark_unexecuted_tests`
first gives every such cell an error output; and a kernel that died is a run result here, not a
crash of autograde, so the submission is still recorded with its zeros.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import sys
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import nbformat

# nbgrader 0.9.6 + SQLAlchemy 2 warn on every autograde about objects "not in session" (harmless,
# nbgrader's own code); they would bury the grader's progress bar.
warnings.filterwarnings("ignore", message=r"Object of type <Submitted")

#: The autograded cell whose output the grader replaces with its own measurement.
OUTCOME_CELL = "outcome"
#: Locked cells the grader's clean test pass runs before the tests (no student code in them).
CONTEXT_CELLS = ("setup",)
PARAMETERS_CELL = "parameters"
EXECUTED_DIR = "executed"
#: The student's cell may hold at most this much source. The reference solution is 2.6 kB; 16 kB is
#: six times that, and far below the reference model's weights (106k parameters: 414 kB as float32,
#: 104 kB at 8 bits), so a run cannot carry in weights trained elsewhere at full size.
MAX_STUDENT_CELL_BYTES = 16 * 1024


class CourseError(RuntimeError):
    """Bad input for the grader: the message is one line naming the fix."""


class InvalidCells(ValueError):
    """The submission's own cells cannot be found: the message says what to do."""


def _nbgrader_on_path() -> None:
    # nbgrader runs `alembic` (database migrations) as a command: it lives next to this Python.
    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([bin_dir, os.environ.get("PATH", "")])


def file_sha256(path: Path) -> str:
    """SHA-256 of a regular file's bytes, read without following a link or blocking on a fifo.

    A link, fifo, folder or device gets a digest of its kind instead (so it is never "unchanged"
    from a real notebook and is graded, and then rejected, like any other submission).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        return hashlib.sha256(f"unreadable: {error.strerror}".encode()).hexdigest()
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return hashlib.sha256(f"not a regular file: mode {info.st_mode:o}".encode()).hexdigest()
        digest = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
        return digest.hexdigest()
    finally:
        os.close(fd)


def copy_course(destination: str | os.PathLike, assignment: str = "assessment") -> "Course":
    """A new course folder with this checkout's ``nbgrader_config.py`` and ``source/``, release built.

    For the tests and the benchmark, which grade demo cohorts away from ``assignments/``.
    """
    from mgpu.runtime import paths

    destination = Path(destination)
    destination.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(paths.ROOT / "assignments" / "nbgrader_config.py", destination / "nbgrader_config.py")
    shutil.copytree(paths.ROOT / "assignments" / "source", destination / "source")
    course = Course(destination, assignment)
    course.ensure_release()
    return course


@dataclass
class SourceCellInfo:
    grade_id: str
    locked: bool
    checksum: str
    source: str
    cell_type: str
    points: float | None  # for grade cells


class Course:
    """One nbgrader course folder and one assignment in it."""

    def __init__(self, course_dir: str | os.PathLike, assignment: str):
        self.root = Path(course_dir).resolve()
        self.assignment = assignment
        if not self.root.is_dir():
            raise CourseError(f"no course folder {course_dir}: pass the folder that holds nbgrader_config.py "
                              "and source/ (this repo's is assignments/)")
        source = self.root / "source"
        if not (source / assignment).is_dir():
            known = sorted(p.name for p in source.iterdir() if p.is_dir()) if source.is_dir() else []
            raise CourseError(f"unknown assignment {assignment!r} in {self.root}: "
                              + (f"choose one of {', '.join(known)}" if known
                                 else "this folder has no source/<assignment>/ (is it an nbgrader course?)"))
        _nbgrader_on_path()
        from nbgrader.apps import NbGraderAPI
        from nbgrader.coursedir import CourseDirectory
        from traitlets.config import Config
        from traitlets.config.loader import PyFileConfigLoader

        config = Config()
        if (self.root / "nbgrader_config.py").exists():
            config.merge(PyFileConfigLoader("nbgrader_config.py", path=str(self.root)).load_config())
        config.CourseDirectory.root = str(self.root)
        # The grader executed the notebook already: nbgrader only reads the outputs.
        config.Execute.enabled = False
        config.ClearOutput.enabled = False
        config.CourseDirectory.submitted_directory = EXECUTED_DIR
        # nbgrader 0.9.6's feedback keeps hidden tests; the students must not see them.
        from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
        from nbgrader.preprocessors import ClearHiddenTests, GetGrades

        config.GenerateFeedback.preprocessors = [GetGrades, ClearHiddenTests, CSSHTMLHeaderPreprocessor]
        self.config = config
        self.coursedir = CourseDirectory(config=config)
        self.api = NbGraderAPI(self.coursedir, config=config)

    # ---------------------------------------------------------------------------------- paths

    @property
    def db_url(self) -> str:
        return self.coursedir.db_url

    @property
    def course_id(self) -> str:
        return str(self.config.CourseDirectory.get("course_id") or self.root.name)

    def release_dir(self) -> Path:
        return self.root / "release" / self.assignment

    def notebook_ids(self) -> list[str]:
        return sorted(p.stem for p in (self.root / "source" / self.assignment).glob("*.ipynb"))

    def submitted_dir(self, student: str) -> Path:
        return self.root / "submitted" / student / self.assignment

    def executed_dir(self, student: str) -> Path:
        return self.root / EXECUTED_DIR / student / self.assignment

    def results_dir(self) -> Path:
        return self.root / "autograder" / self.assignment

    # ------------------------------------------------------------------------------ release

    def ensure_release(self) -> None:
        """Generate the release (and the gradebook's record of the source cells) if missing or stale."""
        source = self.root / "source" / self.assignment
        release = self.release_dir()
        newest_source = max(p.stat().st_mtime for p in source.rglob("*") if p.is_file())
        fresh = release.is_dir() and all((release / f"{n}.ipynb").exists() for n in self.notebook_ids()) \
            and min(p.stat().st_mtime for p in release.rglob("*.ipynb")) >= newest_source
        if fresh and self._assignment_in_gradebook():
            return
        result = self.api.generate_assignment(self.assignment, force=True, create=True)
        if not result["success"]:
            last = (result.get("error") or result.get("log") or "").strip().splitlines()[-1:]
            raise CourseError(f"nbgrader generate_assignment {self.assignment} failed: {' '.join(last)}")

    def _assignment_in_gradebook(self) -> bool:
        from nbgrader.api import Gradebook, MissingEntry

        try:
            with Gradebook(self.db_url) as gb:
                assignment = gb.find_assignment(self.assignment)
                return {n.name for n in assignment.notebooks} == set(self.notebook_ids())
        except MissingEntry:
            return False

    def source_cells(self, notebook_id: str) -> dict[str, SourceCellInfo]:
        from nbgrader.api import Gradebook

        with Gradebook(self.db_url) as gb:
            notebook = gb.find_notebook(notebook_id, self.assignment)
            points = {c.name: float(c.max_score) for c in notebook.grade_cells}
            return {c.name: SourceCellInfo(c.name, bool(c.locked), c.checksum, c.source, c.cell_type,
                                           points.get(c.name))
                    for c in notebook.source_cells}

    # -------------------------------------------------------------------------- submissions

    def students(self) -> list[str]:
        base = self.root / "submitted"
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if (p / self.assignment).is_dir())

    def refused_imports_path(self) -> Path:
        """Where :meth:`import_submissions` lists what it left out (read by :func:`report.refused_imports`)."""
        return self.results_dir() / "import" / "refused.json"

    def import_submissions(self, path: str | os.PathLike) -> tuple[list[str], list[dict]]:
        """Copy a folder or zip of notebooks into ``submitted/<stem>/<assignment>/``.

        Returns ``(imported, refused)``: the student ids written, and ``{"name", "reason"}`` for each
        notebook left out — a link, a fifo, a folder or a device (never followed or read), a file or
        zip entry over :data:`validate.MAX_NOTEBOOK_BYTES` (a zip entry's declared size is checked
        before anything is written, and the bytes are counted while they are copied), a zip entry
        whose CRC does not match, and every one of two or more names that map to the same student
        id (none of them replaces the other). Each notebook is written atomically; the refusals are
        kept in :meth:`refused_imports_path` for the report. Raises :class:`CourseError` when
        ``path`` is missing or holds no notebook to import.
        """
        from autograder import validate

        path = Path(path)
        notebook_id = self.notebook_ids()[0]
        if not os.path.lexists(path):
            raise CourseError(f"no such submissions folder or zip: {path}")
        if path.is_symlink():
            raise CourseError(f"{path} is a link: pass the folder or zip itself")
        limit = validate.MAX_NOTEBOOK_BYTES
        found: dict[str, list[str]] = {}   # student id -> names in the batch
        readers: dict[str, object] = {}   # name -> callable returning the bytes or raising _Refused
        refused: list[dict] = []
        if path.is_file() and zipfile.is_zipfile(path):
            archive = zipfile.ZipFile(path)
            for info in archive.infolist():
                name = info.filename
                stem = Path(name)
                if info.is_dir() or stem.suffix != ".ipynb" or name.startswith("__MACOSX/"):
                    continue  # not a notebook, or the resource forks macOS adds to a zip
                why = _unusable_name(stem.name) or (
                    "a Jupyter checkpoint, not a submission" if ".ipynb_checkpoints" in stem.parts else "")
                if why:
                    refused.append({"name": name, "reason": why})
                    continue
                if info.file_size > limit:
                    refused.append({"name": name, "reason": f"{info.file_size / 2**20:.1f} MB unpacked, more "
                                    f"than the {limit / 2**20:.0f} MB limit"})
                    continue
                found.setdefault(_student_id(stem.stem), []).append(name)
                readers[name] = (lambda info=info: _read_zip_entry(archive, info, limit))
        elif path.is_dir():
            archive = None
            for entry in sorted(os.scandir(path), key=lambda e: e.name):
                if not entry.name.endswith(".ipynb"):
                    continue
                why = _unusable_name(entry.name)
                if why:
                    refused.append({"name": entry.name, "reason": why})
                    continue
                found.setdefault(_student_id(entry.name[:-len(".ipynb")]), []).append(entry.name)
                readers[entry.name] = (lambda entry=entry: _read_file_entry(path, entry.name, limit))
        else:
            raise CourseError(f"{path} is neither a folder of notebooks nor a zip file")
        try:
            imported = []
            for student, names in sorted(found.items()):
                if len(names) > 1:
                    for name in names:
                        others = ", ".join(n for n in names if n != name)
                        refused.append({"name": name, "reason": f"names the same student ({student}) as "
                                        f"{others}: none of them was imported; rename and import again"})
                    continue
                try:
                    data = readers[names[0]]()
                except _Refused as error:
                    refused.append({"name": names[0], "reason": str(error)})
                    continue
                target = self.submitted_dir(student) / f"{notebook_id}.ipynb"
                target.parent.mkdir(parents=True, exist_ok=True)
                _write_bytes_atomically(target, data)
                imported.append(student)
        finally:
            if archive is not None:
                archive.close()
        refused.sort(key=lambda r: r["name"])
        import json

        _write_atomically(self.refused_imports_path(), json.dumps(refused, indent=1))
        if not imported:
            if refused:
                raise CourseError(f"nothing imported from {path}: {len(refused)} notebook(s) refused "
                                  f"({refused[0]['name']}: {refused[0]['reason']}); they are listed in "
                                  f"{self.refused_imports_path()}")
            raise CourseError(f"no .ipynb files in {path}")
        return imported, refused

    # ------------------------------------------------------------------------ notebook edits

    def restore_locked_cells(self, notebook, notebook_id: str) -> list[str]:
        """Overwrite modified locked cells from the gradebook (nbgrader's OverwriteCells).

        Returns the grade_ids whose checksum did not match before the restore.
        """
        from nbgrader.preprocessors import OverwriteCells
        from nbgrader.utils import compute_checksum, is_locked

        cells = self.source_cells(notebook_id)
        # A locked cell is unmodified when it matches the source (gradebook checksum) or the release
        # (where hidden tests are removed, so nbgrader's own checksum differs by design).
        released = {}
        release_path = self.release_dir() / f"{notebook_id}.ipynb"
        if release_path.exists():
            for cell in nbformat.read(release_path, as_version=4).cells:
                if "grade_id" in cell.metadata.get("nbgrader", {}):
                    released[cell.metadata.nbgrader["grade_id"]] = compute_checksum(cell)
        changed = []
        for cell in notebook.cells:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
            info = cells.get(grade_id)
            if info is None or not info.locked:
                continue
            if (cell.cell_type != info.cell_type or not is_locked(cell)
                    or _checksum(cell) not in (info.checksum, released.get(grade_id))):
                changed.append(grade_id)
        resources = {"nbgrader": {"notebook": notebook_id, "assignment": self.assignment,
                                  "db_url": self.db_url}}
        OverwriteCells(config=self.config).preprocess(notebook, resources)
        return changed

    def student_cell_ids(self, notebook_id: str) -> list[str]:
        """grade_ids of the cells that are the student's (nbgrader solution cells, not locked)."""
        release = nbformat.read(self.release_dir() / f"{notebook_id}.ipynb", as_version=4)
        return [c.metadata.nbgrader["grade_id"] for c in release.cells
                if c.metadata.get("nbgrader", {}).get("solution") and not c.metadata.nbgrader.get("locked")]

    def canonical_notebook(self, submitted, notebook_id: str) -> tuple["nbformat.NotebookNode", list[str], list[str]]:
        """The notebook the grader runs, built from the release, and what differed in the submission.

        Every cell, its order, type and nbgrader metadata come from the release; locked cells are
        then restored from the gradebook (which puts the hidden tests back). Only the source of
        the student's own cells (:meth:`student_cell_ids`) is taken from the submission, always as
        code. Returns ``(notebook, restored, notes)``: ``restored`` names the locked cells that were
        missing or modified (source, type or metadata); ``notes`` says what else was set aside
        (cells added, cells reordered, a student cell whose type changed).
        """
        release = nbformat.read(self.release_dir() / f"{notebook_id}.ipynb", as_version=4)
        theirs: dict[str, list] = {}
        order: list[str] = []
        added = 0
        known = {c.metadata.get("nbgrader", {}).get("grade_id") for c in release.cells} - {None}
        for cell in submitted.cells:
            info = cell.metadata.get("nbgrader")
            grade_id = info.get("grade_id") if isinstance(info, dict) else None
            if isinstance(grade_id, str) and grade_id in known:
                theirs.setdefault(grade_id, []).append(cell)
                order.append(grade_id)
            elif cell.cell_type == "code" and str(cell.source).strip():
                added += 1
        students = self.student_cell_ids(notebook_id)
        for grade_id in students:
            if grade_id not in theirs:
                raise InvalidCells(f"your cell {grade_id} is missing (or its nbgrader metadata was edited): "
                                   "copy your code into that cell of the released notebook and submit again")
            if len(theirs[grade_id]) > 1:
                raise InvalidCells(f"{len(theirs[grade_id])} cells are marked {grade_id}: keep only one "
                                   "(copy your code into the released notebook's cell)")
            mine = theirs[grade_id][0].source
            size = len((mine if isinstance(mine, str) else "".join(mine)).encode())
            if size > MAX_STUDENT_CELL_BYTES:
                raise InvalidCells(f"your cell {grade_id} is {size / 1024:.0f} KB, more than the "
                                   f"{MAX_STUDENT_CELL_BYTES // 1024} KB a training program needs (the reference "
                                   "solution is under 3 KB): weights and data cannot be brought in through the "
                                   "notebook; submit the training code alone")
        restored, notes = [], []
        from nbgrader.utils import compute_checksum

        gradebook = self.source_cells(notebook_id)
        cells = []
        for original in release.cells:
            cell = nbformat.from_dict(original)
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
            if grade_id in students:
                mine = theirs[grade_id][0]
                cell.source = mine.source if isinstance(mine.source, str) else "".join(mine.source)
                if mine.cell_type != "code":
                    notes.append(f"cell {grade_id} was changed to {mine.cell_type}: graded as code")
            elif grade_id is not None and cell.metadata.nbgrader.get("locked"):
                mine = theirs.get(grade_id, [None])[0]
                expected = gradebook[grade_id].checksum if grade_id in gradebook else None
                if (mine is None or mine.cell_type != cell.cell_type
                        or _graded_metadata(mine) != _graded_metadata(cell)
                        or _checksum(mine) not in (expected, compute_checksum(original))):
                    restored.append(grade_id)
            cells.append(cell)
        release.cells = cells
        restored += [g for g in self.restore_locked_cells(release, notebook_id) if g not in restored]
        released_order = [c.metadata.get("nbgrader", {}).get("grade_id") for c in cells]
        seen = [g for g in dict.fromkeys(order)]
        if seen != [g for g in released_order if g in seen]:
            notes.append("cells reordered: graded in the released order")
        if added:
            notes.append(f"{added} code cell(s) you added were not run: only "
                         f"{', '.join(students)} is yours")
        return release, restored, notes

    # -------------------------------------------------------------------- autograde + feedback

    def autograde(self, student: str, executed_notebook, notebook_id: str, timestamp: Path | None) -> None:
        """Hand the executed notebook to ``nbgrader autograde`` (no execution); raise on failure."""
        folder = self.executed_dir(student)
        folder.mkdir(parents=True, exist_ok=True)
        _write_atomically(folder / f"{notebook_id}.ipynb", nbformat.writes(executed_notebook))
        if timestamp is not None and os.path.lexists(timestamp):
            from autograder import safe_read

            try:  # nbgrader's submission time: a short text file, read like any other submitted file
                _write_bytes_atomically(folder / "timestamp.txt",
                                        safe_read.read_path(timestamp, 4096, fix="resubmit through nbgrader"))
            except safe_read.Rejected:
                pass
        result = self.api.autograde(self.assignment, student, force=True, create=True)
        if not result["success"]:
            last = (result.get("error") or result.get("log") or "").strip().splitlines()[-1:]
            raise CourseError(f"nbgrader autograde failed for {student}: {' '.join(last)}")

    def feedback(self, student: str) -> Path | None:
        result = self.api.generate_feedback(self.assignment, student, force=True)
        if not result["success"]:
            return None
        found = sorted((self.root / "feedback" / student / self.assignment).glob("*.html"))
        return found[0] if found else None

    def scores(self, student: str) -> dict[str, tuple[float, float]]:
        """``{grade_id: (score, max_score)}`` from the gradebook, for every notebook."""
        from nbgrader.api import Gradebook

        out = {}
        with Gradebook(self.db_url) as gb:
            for notebook_id in self.notebook_ids():
                submitted = gb.find_submission_notebook(notebook_id, self.assignment, student)
                for grade in submitted.grades:
                    out[grade.name] = (float(grade.score), float(grade.max_score))
        return out

    def is_graded(self, student: str) -> bool:
        from nbgrader.api import Gradebook, MissingEntry

        try:
            with Gradebook(self.db_url) as gb:
                gb.find_submission(self.assignment, student)
            return True
        except MissingEntry:
            return False


def _checksum(cell) -> str | None:
    """nbgrader's checksum of a cell, or None when its metadata is too damaged to compute one."""
    from nbgrader.utils import compute_checksum

    try:
        return compute_checksum(cell)
    except (KeyError, TypeError, ValueError):
        return None


def _graded_metadata(cell) -> dict:
    """The nbgrader metadata that decides how a cell is graded (not its checksum or schema)."""
    info = cell.metadata.get("nbgrader")
    if not isinstance(info, dict):
        return {}
    return {k: info.get(k) for k in ("grade_id", "grade", "solution", "locked", "points")}


class _Refused(ValueError):
    """A notebook in a batch that is not imported; the message says why."""


def _read_zip_entry(archive: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int) -> bytes:
    chunks, total = [], 0
    try:
        with archive.open(info) as source:  # zipfile stops at the declared size and checks the CRC
            while total <= limit:
                chunk = source.read(1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError, OSError,
            EOFError, ValueError) as error:  # bad CRC, unknown compression, encrypted, truncated
        raise _Refused(f"unreadable zip entry ({error}): add the notebook to the zip again") from None
    if total > limit:
        raise _Refused(f"more than the {limit / 2**20:.0f} MB limit")
    return b"".join(chunks)


def _read_file_entry(folder: Path, name: str, limit: int) -> bytes:
    from autograder import safe_read

    try:
        return safe_read.read_path(folder / name, limit, fix="put the notebook file itself in the folder")
    except safe_read.Rejected as error:
        raise _Refused(str(error)) from None


def _write_bytes_atomically(path: Path, data: bytes) -> None:
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if path.is_symlink() or (path.exists() and not path.is_file()):
            path.unlink() if path.is_symlink() else shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _student_id(stem: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in stem).strip("._")


def _unusable_name(name: str) -> str:
    """Why a notebook's file name gives no student id ('' when it gives one)."""
    if name.startswith("."):
        return "a hidden file (its name starts with '.'): name it <student id>.ipynb and import again"
    if not _student_id(name[:-len(".ipynb")]):
        return "the file name holds no student id: name it <student id>.ipynb and import again"
    return ""


def _write_atomically(path: Path, text: str) -> None:
    from autograder.report import write_atomically

    write_atomically(path, text)


def grade_cells(notebook) -> list:
    from nbgrader.utils import is_grade

    return [c for c in notebook.cells if c.cell_type == "code" and "nbgrader" in c.metadata and is_grade(c)]


def mark_unexecuted_tests(notebook, why: str) -> list[str]:
    """Give every autograded code cell that did not run an error output, so it scores zero."""
    marked = []
    for cell in grade_cells(notebook):
        if cell.metadata["nbgrader"]["grade_id"] == OUTCOME_CELL:
            continue
        status = cell.metadata.get("papermill", {}).get("status")
        if cell.get("execution_count") is None or status not in ("completed", "failed"):
            cell.outputs = [nbformat.v4.new_output(
                "error", ename="NotExecuted", evalue=f"this test did not run: {why}", traceback=[
                    f"NotExecuted: this test did not run: {why}"])]
            marked.append(cell.metadata["nbgrader"]["grade_id"])
    return marked


def condense_test_tracebacks(notebook) -> None:
    """Reduce the error outputs of autograded cells to ``Name: message``.

    IPython's traceback lists the failing cell's code around the failing line, which would show
    hidden tests in the feedback (nbgrader removes them from the cell's source only). The score
    depends on the output being an error, not on its traceback.
    """
    for cell in grade_cells(notebook):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                output["traceback"] = [f"{output.get('ename')}: {output.get('evalue')}"]


def set_outcome(notebook, passed: bool, lines: list[str], reason: str) -> bool:
    """Replace the outcome cell's outputs with the grader's measurement; False if it is missing."""
    for cell in grade_cells(notebook):
        if cell.metadata["nbgrader"]["grade_id"] == OUTCOME_CELL:
            outputs = [nbformat.v4.new_output("stream", name="stdout", text="\n".join(lines) + "\n")]
            if not passed:
                outputs.append(nbformat.v4.new_output("error", ename="OutcomeNotReached", evalue=reason,
                                                      traceback=[f"OutcomeNotReached: {reason}"]))
            cell.outputs = outputs
            cell.execution_count = cell.get("execution_count") or 1
            return True
    return False
