"""A real `mcp-gateway console` for a test (a subprocess on a free loopback port, stopped after), and the
Chromium the Playwright tests drive."""

from __future__ import annotations

import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, BrowserContext, expect, sync_playwright

from tests.deadlines import scaled
from tests.harness import GatewayHome

START_S = 60.0
"""How long a console may take to answer its first request (TEST_TIME_SCALE times it): it waits for
readiness, so this bounds only a console that never starts (about 1 s on a quiet machine)."""
CHROMIUM = Path("/usr/bin/chromium")
"""Debian's chromium (`make chromium`), which the Playwright tests drive."""
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_console(gw: GatewayHome, log_name: str = "console.log") -> Iterator[str]:
    """The console's base URL (http://127.0.0.1:port) once it answers; the process is stopped after."""
    port = free_port()
    log_path = gw.root / log_name
    with log_path.open("wb") as log:
        process = subprocess.Popen(gw.cli_argv("console", "--port", str(port)), stdout=log, stderr=log)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + scaled(START_S)
            while True:
                try:
                    urllib.request.urlopen(url + "/login", timeout=2).close()  # noqa: S310  (the console's own http URL)
                    break
                except (urllib.error.URLError, ConnectionError):
                    if time.monotonic() > deadline or process.poll() is not None:
                        raise AssertionError(log_path.read_text()) from None
                    time.sleep(0.1)
            yield url
        finally:
            stop(process)


@contextmanager
def signed_in_browser(gw: GatewayHome, user: str, password: str, **options: Any) -> Iterator[BrowserContext]:
    """A real console for `gw` and a Chromium context signed in to it as `user`; all of it stopped after."""
    with running_console(gw) as url, sync_playwright() as p:
        browser: Browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context(base_url=url, **options)
        page = context.new_page()
        page.goto("/login")
        page.fill("#user", user)
        page.fill("#password", password)
        page.click("button[type=submit]")
        expect(page).to_have_url(re.compile(r"/calls$"))
        page.close()
        try:
            yield context
        finally:
            context.close()
            browser.close()


def stop(process: subprocess.Popen[bytes]) -> None:
    """Stop a console: SIGTERM, then SIGKILL when it has not ended within 10 s (TEST_TIME_SCALE times)."""
    process.terminate()
    try:
        process.wait(timeout=scaled(10))
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=scaled(10))
