"""Open a report page in a real headless Chromium and check it as a person would see it.

Playwright drives the system's Chromium (Debian's ``chromium`` package, installed by
``make setup-browser``; ``SPECPREFILL_CHROMIUM`` names another binary). The check records
console errors and uncaught page errors, any request that leaves the page's own file (a
self-contained report makes none), whether every image decoded, which tables (by id) are
on the page, and can save a full-page screenshot.

``python -m harness.report.browser results/default/report.html --screenshot plots/reference/report.png``
prints the check and exits 1 when the page has errors or a broken image.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

#: Where Debian, Ubuntu and Chrome put the binary.
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
#: Headless in a closed network as root: no sandbox (root), no GPU, and none of Chromium's
#: own background connections (refused here, and noise in the console).
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def find_chromium() -> str | None:
    """The Chromium binary: ``$SPECPREFILL_CHROMIUM``, else the first of :data:`CANDIDATES` on PATH."""
    named = os.environ.get("SPECPREFILL_CHROMIUM")
    if named:
        return named if Path(named).exists() else None
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class PageCheck:
    """What the browser saw."""

    title: str = ""
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    outside_requests: list[str] = field(default_factory=list)  # anything but the file itself and data: URIs
    images: list[tuple[str, bool]] = field(default_factory=list)  # (alt, decoded with a size)
    tables: list[str] = field(default_factory=list)  # ids of the tables on the page
    height: int = 0
    screenshot: Path | None = None

    @property
    def broken_images(self) -> list[str]:
        return [alt for alt, ok in self.images if not ok]

    @property
    def ok(self) -> bool:
        return not (self.console_errors or self.page_errors or self.outside_requests or self.broken_images)

    def describe(self) -> str:
        return "\n".join(
            [
                f"title: {self.title}",
                f"images: {len(self.images)} ({len(self.broken_images)} broken: {self.broken_images})",
                f"tables: {', '.join(self.tables) or '-'}",
                f"console errors: {self.console_errors or 'none'}",
                f"page errors: {self.page_errors or 'none'}",
                f"requests leaving the page: {self.outside_requests or 'none'}",
                f"page height: {self.height} px" + (f"; screenshot: {self.screenshot}" if self.screenshot else ""),
            ]
        )


def check_page(
    html: Path, screenshot: Path | None = None, width: int = 1400, max_height: int | None = None
) -> PageCheck:
    """Load ``html`` in headless Chromium and report what it saw; with ``screenshot``, save
    the whole page there (cut at ``max_height`` pixels when given)."""
    from playwright.sync_api import sync_playwright

    exe = find_chromium()
    if exe is None:
        raise FileNotFoundError(
            f"no Chromium found (tried $SPECPREFILL_CHROMIUM and {list(CANDIDATES)} on PATH); run `make setup-browser`"
        )
    html = Path(html).resolve()
    url = html.as_uri()
    check = PageCheck()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, headless=True, args=LAUNCH_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.on("console", lambda m: check.console_errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: check.page_errors.append(str(e)))
            page.on(
                "request",
                lambda r: None if r.url == url or r.url.startswith("data:") else check.outside_requests.append(r.url),
            )
            page.goto(url, wait_until="load")
            check.title = page.title()
            check.images = [
                (str(a), bool(ok))
                for a, ok in page.evaluate(
                    "() => Array.from(document.images).map(i => [i.alt, i.complete && i.naturalWidth > 0])"
                )
            ]
            check.tables = list(
                page.evaluate("() => Array.from(document.querySelectorAll('table[id]')).map(t => t.id)")
            )
            check.height = int(page.evaluate("() => document.documentElement.scrollHeight"))
            if screenshot is not None:
                screenshot = Path(screenshot)
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                if max_height is not None and check.height > max_height:
                    page.screenshot(
                        path=str(screenshot),
                        full_page=True,
                        clip={"x": 0, "y": 0, "width": width, "height": max_height},
                    )
                else:
                    page.screenshot(path=str(screenshot), full_page=True)
                check.screenshot = screenshot
        finally:
            browser.close()
    return check


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("html", type=Path, help="the page (a results folder's report.html)")
    ap.add_argument("--screenshot", type=Path, help="save a screenshot of the page here (PNG)")
    ap.add_argument("--max-height", type=int, default=None, help="cut the screenshot at this many pixels")
    a = ap.parse_args(argv)
    if not a.html.is_file():
        raise SystemExit(f"html={str(a.html)!r}: no such file; `make report out=<folder>` writes <folder>/report.html")
    check = check_page(a.html, a.screenshot, max_height=a.max_height)
    print(check.describe())
    sys.exit(0 if check.ok else 1)


if __name__ == "__main__":
    main()
