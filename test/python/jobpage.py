"""gpulaunch-rdzv's job page and its data, for the Python tests that check
them (as test/browser.c does for the C ones): /status and /metrics over
HTTP, the page's DOM after its scripts ran in headless Chromium (Debian's
package, scripts/deps.sh), and the page drawn in a 1280 px frame."""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request
from pathlib import Path
from typing import Any, Optional

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage",
         "--virtual-time-budget=4000"]


def chromium() -> Optional[str]:
    """Chromium's path, None when it is not installed."""
    for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if os.access(p, os.X_OK):
            return p
    return None


def get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return str(r.read().decode())


def status(port: int, job: str) -> dict[str, Any]:
    """The job's entry of /status?job=JOB."""
    doc = json.loads(get(port, f"/status?job={job}"))
    for j in doc["jobs"]:
        if j["run_id"] == job:
            return dict(j)
    raise AssertionError(f"/status has no job {job!r}: {doc}")


def metric(text: str, series: str) -> Optional[float]:
    """The value of one exact series (name{labels}) in Prometheus text."""
    for ln in text.splitlines():
        if ln.startswith(series + " "):
            return float(ln.split(" ")[1])
    return None


def _run(args: list[str], tmp: Path) -> str:
    p = subprocess.run(args + [f"--user-data-dir={tmp / 'profile'}"], capture_output=True, text=True,
                       encoding="utf-8", errors="replace", timeout=90)
    assert p.returncode == 0, f"chromium exited {p.returncode}: {p.stderr[-2000:]}"
    return p.stdout


def dom(tmp: Path, port: int, job: str) -> str:
    """The DOM of the job's page after its scripts ran."""
    b = chromium()
    assert b is not None
    return _run([b, *FLAGS, "--dump-dom", f"http://127.0.0.1:{port}/#job={job}"], tmp)


def width_1280(tmp: Path, port: int, job: str, drawn_id: str) -> tuple[int, int, bool]:
    """(the content's scroll width, the frame's client width, whether element
    drawn_id is there) of the page drawn in a 1280 px frame: the page, fetched
    by a local file, drawn in a frame of that file's own with the server as
    its base (reading the server from a file needs --disable-web-security)."""
    b = chromium()
    assert b is not None
    frame = tmp / f"frame-{job}.html"
    frame.write_text(
        '<!doctype html><body style="margin:0"><iframe id="f" style="width:1280px;height:900px;border:0">'
        "</iframe><script>\n"
        f"const srv = 'http://127.0.0.1:{port}/', f = document.getElementById('f');\n"
        "const say = w => document.body.setAttribute('data-width', w);\n"
        "const measure = () => { const d = f.contentDocument.documentElement;\n"
        "  say(d.scrollWidth + ' ' + d.clientWidth + ' ' +\n"
        f"      (f.contentDocument.getElementById('{drawn_id}') ? 'drawn' : 'empty')); }};\n"
        "fetch(srv).then(r => r.text()).then(t => {\n"
        f"  f.onload = () => {{ f.onload = null; f.contentWindow.location.hash = 'job={job}';\n"
        "    setTimeout(measure, 2500); };\n"
        "  f.srcdoc = t.replace('<head>', '<head><base href=\"' + srv + '\">'); })\n"
        "  .catch(e => say('error ' + e));\n"
        "</script></body>\n")
    out = _run([b, *FLAGS, "--disable-web-security", "--dump-dom", f"file://{frame}"], tmp)
    m = re.search(r'data-width="(\d+) (\d+) ([a-z]+)"', out)
    assert m, f"the frame was not measured: {out[:2000]}"
    return int(m[1]), int(m[2]), m[3] == "drawn"
