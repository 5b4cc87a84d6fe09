"""A headless Chromium driven through chromedriver's W3C WebDriver HTTP API (Debian's
`chromium` and `chromium-driver`, which .ci/run installs), with the standard library only: the
report tests and bench/report_render.py load a page as a person's browser would, read what
it drew, its console and a screenshot, without selenium."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def require_browser() -> None:
    """Skip without Chromium and its driver, with the reason; with CI set, fail instead (CI
    installs them, so their absence there is a broken set-up, not a reason to skip)."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if not missing:
        return
    why = f"{', '.join(missing)} missing: apt-get install chromium chromium-driver (.ci/run does)"
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Browser:
    """One Chromium session; use as a context manager."""

    def __init__(self, width: int = 1280, height: int = 1600) -> None:
        self.port = _free_port()
        self.driver = subprocess.Popen(
            [CHROMEDRIVER, f"--port={self.port}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.size = (width, height)
        self.session = ""

    def _call(self, method: str, path: str, body: dict | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=120) as answer:
            return json.loads(answer.read())["value"]

    def __enter__(self) -> Browser:
        deadline = time.monotonic() + 30
        while True:  # chromedriver takes a moment to listen
            try:
                self._call("GET", "/status")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={self.size[0]},{self.size[1]}"]  # fmt: skip
        options = {"binary": CHROMIUM, "args": args}
        capabilities = {"browserName": "chrome", "goog:chromeOptions": options,
                        "goog:loggingPrefs": {"browser": "ALL"}}  # fmt: skip
        answer = self._call("POST", "/session", {"capabilities": {"alwaysMatch": capabilities}})
        self.session = answer["sessionId"]
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.session:
                self._call("DELETE", f"/session/{self.session}")
        finally:
            self.driver.terminate()
            self.driver.wait(timeout=30)

    def open(self, page: Path) -> None:
        self._call("POST", f"/session/{self.session}/url", {"url": page.resolve().as_uri()})

    def run(self, script: str, *args: Any) -> Any:
        """A script's return value; the page's elements come back as WebDriver references."""
        body = {"script": script, "args": list(args)}
        return self._call("POST", f"/session/{self.session}/execute/sync", body)

    def console(self) -> list[dict]:
        """The console's entries since the last call (level, message)."""
        return self._call("POST", f"/session/{self.session}/se/log", {"type": "browser"})

    def screenshot(self, path: Path) -> Path:
        shot = self._call("GET", f"/session/{self.session}/screenshot")
        path.write_bytes(base64.b64decode(shot))
        return path
