"""`make lab`'s server: JupyterLab starts on the notebooks folder and serves them."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_jupyterlab_serves_the_course_notebooks(tmp_path):
    jupyter = Path(sys.executable).with_name("jupyter")
    if not jupyter.exists():
        jupyter = Path(shutil.which("jupyter"))
    port, token = _free_port(), "course-test-token"
    command = [str(jupyter), "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
               f"--IdentityProvider.token={token}", f"--notebook-dir={ROOT / 'notebooks'}"]
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
        assert "00_setup_check.ipynb" in names
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token={token}", timeout=10) as page:
            assert page.status == 200 and b"JupyterLab" in page.read()
        log = (tmp_path / "lab.log").read_text()
        assert "Traceback" not in log, log[-3000:]
    finally:
        server.terminate()
        server.wait(timeout=30)
