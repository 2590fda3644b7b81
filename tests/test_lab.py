"""`make lab`: the learner's copies of the labs are written, and JupyterLab starts on them and serves them."""

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from mgpu.runtime import launch

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_jupyterlab_serves_the_learners_copies_of_the_labs(tmp_path):
    lab_dir = tmp_path / "lab"
    written = subprocess.run([sys.executable, "-m", "mgpu.runtime.labs", "--lab-dir", str(lab_dir)],
                             capture_output=True, text=True, cwd=ROOT)
    assert written.returncode == 0, written.stderr
    assert "exercise cell(s) to fill in" in written.stdout
    jupyter = Path(sys.executable).with_name("jupyter")
    if not jupyter.exists():
        jupyter = Path(shutil.which("jupyter"))
    port, token = launch.free_port(), "course-test-token"
    command = [str(jupyter), "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
               f"--IdentityProvider.token={token}", f"--notebook-dir={lab_dir}"]
    if os.geteuid() == 0:
        command.append("--allow-root")
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "lab.log", "w"), env=env)
    try:
        deadline, listing = time.time() + 90, None
        while time.time() < deadline and listing is None:
            if server.poll() is not None:
                pytest.fail("JupyterLab exited:\n" + (tmp_path / "lab.log").read_text()[-3000:])
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents?token={token}", timeout=5) as r:
                    listing = json.load(r)
            except OSError:
                time.sleep(1)
        assert listing is not None, (tmp_path / "lab.log").read_text()[-3000:]
        names = {item["name"] for item in listing["content"]}
        assert {p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")} <= names
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents/02_batch_size.ipynb?token={token}",
                                    timeout=10) as r:
            served = json.load(r)["content"]
        source = "".join("".join(c["source"]) for c in served["cells"])
        assert "raise NotImplementedError()" in source and "BEGIN SOLUTION" not in source
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token={token}", timeout=10) as page:
            assert page.status == 200 and b"JupyterLab" in page.read()
        log = (tmp_path / "lab.log").read_text()
        assert "Traceback" not in log, log[-3000:]
    finally:
        server.terminate()
        server.wait(timeout=30)
