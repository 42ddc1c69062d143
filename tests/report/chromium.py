"""Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe:
the browser reads commands on fd 3 and answers on fd 4), with the standard library alone:
a page's DOM and script results, every request it makes, and a screenshot."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_FLAGS = [
    "--headless",
    "--no-sandbox",  # tests run as root
    "--disable-gpu",
    "--remote-debugging-pipe",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class Page:
    """What a page did: the URLs it requested, the script errors it raised."""

    browser: Chromium
    session: str
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def evaluate(self, expression: str) -> Any:
        result = self.browser.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            self.session,
        )
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {expression}")

    def screenshot(self, path: Path) -> None:
        shot = self.browser.send("Page.captureScreenshot", {"format": "png"}, self.session)
        path.write_bytes(base64.b64decode(shot["data"]))


class Chromium:
    def __init__(self, width: int = 1400, height: int = 1000) -> None:
        executable = chromium_path()
        if executable is None:
            raise RuntimeError("no chromium on PATH")
        self.width, self.height = width, height
        self._profile = tempfile.mkdtemp(prefix="onnxfuse-chromium-")
        to_child, self._commands = os.pipe()
        self._answers, from_child = os.pipe()

        def pipes_at_3_and_4() -> None:
            os.dup2(to_child, 3)
            os.dup2(from_child, 4)

        self.process = subprocess.Popen(
            [executable, *_FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=pipes_at_3_and_4,
            pass_fds=(3, 4),
        )
        os.close(to_child)
        os.close(from_child)
        self._next = 0
        self._buffer = b""
        self._pages: dict[str, Page] = {}

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        while True:
            answer = self._read()
            if answer.get("id") == self._next:
                if "error" in answer:
                    raise AssertionError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self._event(answer)

    def _read(self) -> dict:
        while b"\0" not in self._buffer:
            chunk = os.read(self._answers, 1 << 20)
            if not chunk:
                raise AssertionError("chromium closed the DevTools pipe")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def _event(self, message: dict) -> None:
        page = self._pages.get(message.get("sessionId", ""))
        if page is None:
            return
        method, params = message.get("method"), message.get("params", {})
        if method == "Network.requestWillBeSent":
            page.requests.append(params["request"]["url"])
        elif method == "Runtime.exceptionThrown":
            page.errors.append(json.dumps(params["exceptionDetails"])[:500])

    def open(self, url: str) -> Page:
        """A new tab at ``url``, once its load event fired."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        page = self._pages[session] = Page(self, session)
        for domain in ("Network", "Page", "Runtime"):
            self.send(f"{domain}.enable", {}, session)
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False},
            session,
        )
        self.send("Page.navigate", {"url": url}, session)
        page.wait_for("document.readyState === 'complete'")
        return page

    def close(self) -> None:
        with contextlib.suppress(AssertionError):
            self.send("Browser.close")
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._commands)
        os.close(self._answers)
        shutil.rmtree(self._profile, ignore_errors=True)
