"""A real headless Chromium driven over the DevTools protocol, for the report tests.

    with Browser.start(tmp_path / "chromium") as browser:
        page = browser.open(report_path)          # console errors, requests, DOM queries, screenshot
        page.console_errors, page.requests, page.evaluate("document.title")

Chromium is Debian's ``chromium`` package (scripts/install-system installs it). It is started in its
own process group with a fresh profile, every background service off, and ``--remote-debugging-port=0``:
it binds a free port itself and writes it to ``DevToolsActivePort`` in the profile (no port race).
The protocol is spoken over aiohttp's websocket client (aiohttp is already harvest's HTTP client,
so the tests need no second library for it). Only the process group this module started is
signalled, by the pid recorded at launch.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.realparts import chromium_path  # one lookup of the binary, shared with the CI gate

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars")
START_TIMEOUT = 60.0
CALL_TIMEOUT = 60.0


class Page:
    """One tab: what it logged and requested, and calls into it."""

    def __init__(self, browser: Browser, ws: aiohttp.ClientWebSocketResponse):
        self._browser = browser
        self._ws = ws
        self._id = 0
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._events: dict[str, asyncio.Event] = {}
        self.console_errors: list[str] = []
        self.console_messages: list[str] = []
        self.requests: list[str] = []
        self._reader = browser.loop.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self._ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            if "id" in data:
                fut = self._pending.pop(data["id"], None)
                if fut is not None and not fut.done():
                    if "error" in data:
                        fut.set_exception(RuntimeError(f"CDP error: {data['error']}"))
                    else:
                        fut.set_result(data.get("result", {}))
                continue
            method, params = data.get("method"), data.get("params", {})
            if method == "Runtime.consoleAPICalled":
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                self.console_messages.append(f"{params.get('type')}: {text}")
                if params.get("type") in ("error", "assert"):
                    self.console_errors.append(text)
            elif method == "Runtime.exceptionThrown":
                self.console_errors.append(json.dumps(params.get("exceptionDetails", {}))[:500])
            elif method == "Log.entryAdded":
                entry = params.get("entry", {})
                self.console_messages.append(f"log {entry.get('level')}: {entry.get('text')}")
                if entry.get("level") == "error":
                    self.console_errors.append(f"{entry.get('text')} ({entry.get('url')})")
            elif method == "Network.requestWillBeSent":
                self.requests.append(params.get("request", {}).get("url", ""))
            if method in self._events:
                self._events[method].set()

    async def _call(self, method: str, **params: Any) -> Any:
        self._id += 1
        fut: asyncio.Future[Any] = self._browser.loop.create_future()
        self._pending[self._id] = fut
        await self._ws.send_str(json.dumps({"id": self._id, "method": method, "params": params}))
        return await asyncio.wait_for(fut, CALL_TIMEOUT)

    def call(self, method: str, **params: Any) -> Any:
        return self._browser.run(self._call(method, **params))

    async def _navigate(self, url: str) -> None:
        loaded = self._events.setdefault("Page.loadEventFired", asyncio.Event())
        loaded.clear()
        await self._call("Page.navigate", url=url)
        await asyncio.wait_for(loaded.wait(), CALL_TIMEOUT)

    def navigate(self, url: str) -> None:
        self._browser.run(self._navigate(url))
        time.sleep(0.3)  # late console messages of the load (a bounded pause, not a wait for an event)

    def evaluate(self, expression: str) -> Any:
        """The JSON value of ``expression`` evaluated in the page; raises on an exception in it."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"evaluating {expression[:80]!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path, width: int = 1280) -> Path:
        """A PNG of the whole page (not only the viewport)."""
        height = int(self.evaluate("Math.ceil(document.documentElement.scrollHeight)") or 800)
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=min(height, 16000), deviceScaleFactor=1,
                  mobile=False)
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def print_pdf(self, path: Path) -> Path:
        pdf = self.call("Page.printToPDF", printBackground=False, preferCSSPageSize=False)
        path.write_bytes(base64.b64decode(pdf["data"]))
        return path


class Browser:
    """A headless Chromium this test started (its own process group), with a fresh profile."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, profile: Path, log_path: Path):
        self.proc, self.port, self.profile, self.log_path = proc, port, profile, log_path
        self.loop = asyncio.new_event_loop()
        self.session: aiohttp.ClientSession | None = None
        self.pages: list[Page] = []

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    @classmethod
    def start(cls, workdir: Path) -> Browser:
        binary = chromium_path()
        if binary is None:
            raise FileNotFoundError("chromium is not installed (scripts/install-system installs it)")
        profile = workdir / "profile"
        profile.mkdir(parents=True, exist_ok=True)
        log_path = workdir / "chromium.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
                                     "--remote-debugging-address=127.0.0.1", "about:blank"],
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if port_file.exists():
                lines = port_file.read_text().splitlines()
                if lines and lines[0].strip().isdigit():
                    return cls(proc, int(lines[0]), profile, log_path)
            if proc.poll() is not None or time.monotonic() > deadline:
                _end_group(proc)
                raise RuntimeError(f"chromium did not start (exit {proc.returncode}): "
                                   f"{log_path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.1)

    async def _open(self) -> Page:
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT))
        base = f"http://127.0.0.1:{self.port}"
        async with self.session.put(f"{base}/json/new?about:blank") as resp:
            target = await resp.json(content_type=None)
        ws = await self.session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0)
        page = Page(self, ws)
        for domain in ("Page", "Runtime", "Log", "Network"):
            await page._call(f"{domain}.enable")
        return page

    def open(self, path: Path) -> Page:
        """A new tab with the file at ``path`` loaded."""
        page = self.run(self._open())
        self.pages.append(page)
        page.navigate(Path(path).resolve().as_uri())
        return page

    def close(self) -> None:
        try:
            for page in self.pages:
                self.run(page._ws.close())
                page._reader.cancel()
            if self.session is not None:
                self.run(self.session.close())
        finally:
            self.loop.close()
            _end_group(self.proc)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _end_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL, of the process group started for ``proc`` (its pid is the group id)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        except ProcessLookupError:
            pass
    # children left in the group after the leader exited
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


__all__ = ["Browser", "Page", "chromium_path"]
