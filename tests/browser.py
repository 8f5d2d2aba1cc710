"""Drive the system's Chromium with Playwright (tests/e2e/test_browser.py, scripts/screenshots).

Only the operating system's Chromium is used: Debian's ``chromium`` package, i.e.
``/usr/bin/chromium`` (``LEASEJOBS_CHROMIUM`` names another binary). Playwright's own
browser builds are never downloaded (``playwright install`` is not needed); the
Python package only brings the driver that speaks to the browser.

A note for callers that also use the Django ORM: inside ``sync_playwright()`` the
thread has a running asyncio event loop (Playwright's sync API runs one under the
hood), so Django refuses ORM calls with ``SynchronousOnlyOperation`` unless
``DJANGO_ALLOW_ASYNC_UNSAFE`` is set. Nothing runs concurrently there, so setting it
for the duration of a browser session is safe. Django then keeps that thread's
connections in a context variable, apart from its usual ones: call
``django.db.connections.close_all()`` before the session ends, or they leak.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext, Page

REPO_ROOT = Path(__file__).resolve().parent.parent
SCREENSHOT_ROOT = REPO_ROOT / "artifacts" / "screenshots"
DEFAULT_CHROMIUM = "/usr/bin/chromium"
PHONE = (390, 844)
"""A phone's viewport in CSS pixels (an iPhone 12 to 15)."""

# Headless, no sandbox (we may be root in a container), and nothing that phones home.
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def chromium_path() -> str:
    return os.environ.get("LEASEJOBS_CHROMIUM") or DEFAULT_CHROMIUM


def in_ci() -> bool:
    """True when the ``CI`` environment variable says so (``CI=true``, as CI sets it)."""
    return os.environ.get("CI", "").strip().lower() not in {"", "0", "false", "no", "off"}


def missing_browser() -> str | None:
    """Why no browser session can be started here, or None when one can."""
    path = chromium_path()
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        return f"no Chromium at {path} (Debian: apt-get install chromium)"
    return None


def missing_playwright() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        return (
            f"the playwright package is missing ({exc}); install the test dependency group: "
            "pip install -e . --group test (scripts/test does)"
        )
    return None


@contextlib.contextmanager
def chromium(
    *, width: int = 1366, height: int = 768, scale: float = 1.0, mobile: bool = False
) -> Iterator[BrowserContext]:
    """A headless Chromium with a fresh throwaway profile, as a Playwright BrowserContext.

    1366x768 by default, a common laptop screen; ``mobile`` makes it a touch phone (use
    with a phone's size, such as :data:`PHONE`)."""
    from playwright.sync_api import sync_playwright

    with (
        tempfile.TemporaryDirectory(prefix="leasejobs-chromium-") as profile,
        sync_playwright() as playwright,
    ):
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=chromium_path(),
            headless=True,
            args=list(CHROMIUM_ARGS),
            viewport={"width": width, "height": height},
            device_scale_factor=scale,
            is_mobile=mobile,
            has_touch=mobile,
            locale="en-US",
            timezone_id="UTC",
        )
        try:
            yield context
        finally:
            context.close()


class PageProblems:
    """Collects what a person would notice as broken: script errors and failed requests."""

    def __init__(self, page: Page) -> None:
        self.items: list[str] = []
        page.on("pageerror", lambda error: self.items.append(f"page error: {error}"))
        page.on("console", self._console)
        page.on("response", self._response)
        page.on("requestfailed", self._request_failed)

    def _console(self, message: Any) -> None:
        if message.type == "error" and "favicon.ico" not in (message.location or {}).get("url", ""):
            self.items.append(f"console error: {message.text}")

    def _request_failed(self, request: Any) -> None:
        # A dashboard refresh still in flight when the page navigates away is aborted.
        if "ERR_ABORTED" not in (request.failure or ""):
            self.items.append(f"request failed: {request.url} {request.failure}")

    def _response(self, response: Any) -> None:
        if response.status >= 400 and not response.url.endswith("/favicon.ico"):
            self.items.append(f"HTTP {response.status}: {response.url}")


def screenshot_dir(label: str) -> Path:
    """``artifacts/screenshots/<python>-<label>/`` (created), one per CI combination."""
    python = "py{}.{}".format(*sys.version_info[:2])
    path = SCREENSHOT_ROOT / f"{python}-{label}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def log_in(page: Page, base_url: str, username: str, password: str) -> None:
    """Log into the admin through its login form, like a person."""
    page.goto(f"{base_url}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_selector("#user-tools")


# Django's admin keeps the navigation sidebar's state here; open (or no value) is the
# default on a wide window.
NAV_SIDEBAR_KEY = "django.admin.navSidebarIsOpen"


def keep_nav_sidebar_open(context: BrowserContext) -> None:
    """Every page of ``context`` starts with the admin's navigation sidebar open, as a
    person sees the admin first (and as a click on its toggle would otherwise change)."""
    context.add_init_script(f"window.localStorage.setItem({NAV_SIDEBAR_KEY!r}, 'true');")


def nav_sidebar_is_open(page: Page) -> bool:
    return bool(
        page.evaluate(
            "() => { const nav = document.getElementById('nav-sidebar');"
            " return nav !== null && document.getElementById('main').classList.contains("
            "'shifted') && getComputedStyle(nav).visibility === 'visible'"
            " && nav.getBoundingClientRect().width > 0; }"
        )
    )


def cut_off_headers(page: Page, selector: str = "#content table") -> list[str]:
    """Header cells of the tables matching ``selector`` (by default, the page's own, not
    the navigation sidebar's) that end past the window's right edge or past their table's
    container (where a wide table would scroll or hide)."""
    return list(
        page.evaluate(
            """selector => {
                const cut = [];
                for (const table of document.querySelectorAll(selector)) {
                    const box = table.parentElement.getBoundingClientRect();
                    const edge = Math.min(window.innerWidth, box.right) + 0.5;
                    for (const th of table.querySelectorAll('thead th')) {
                        const right = th.getBoundingClientRect().right;
                        if (right > edge) {
                            const name = table.id || table.className || 'table';
                            cut.push(`${name}: "${th.textContent.trim()}" ends at `
                                + `${Math.round(right)} px, past ${Math.round(edge)} px`);
                        }
                    }
                }
                return cut;
            }""",
            selector,
        )
    )


def page_overflow(page: Page) -> int:
    """How many pixels the page is wider than the window (0: no sideways scrolling)."""
    return int(
        page.evaluate("() => Math.max(0, document.documentElement.scrollWidth - window.innerWidth)")
    )


def header_widths(page: Page, selector: str = "#result_list") -> dict[str, int]:
    """Each header cell's width in pixels, by its text (to tell why a table is too wide)."""
    return dict(
        page.evaluate(
            """selector => Array.from(document.querySelectorAll(`${selector} thead th`)).map(
                th => [th.textContent.trim() || th.className,
                       Math.round(th.getBoundingClientRect().width)])""",
            selector,
        )
    )
