"""The built site in a real browser, offline: Debian's chromium, driven by playwright (no browser
download), opens every page over file:// and finds
  - no console errors and no uncaught exceptions;
  - no request that leaves file:// (each one is also blocked, so the page is truly offline);
  - math typeset (MathJax output elements for the page's math);
  - widgets rendered (a drawn widget for each widget view the page holds);
  - every image loaded (naturalWidth > 0).
It saves screenshots of the home page and of one lecture into the build folder.

It uses the students' site that tests/test_site.py builds (one build per test process). To check
a site built by `make site`:

    python -m tests.test_site_browser _build/html
"""

import sys
from pathlib import Path

import pytest

from tests.test_site import site  # noqa: F401  (the session fixture: the site is built once)

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
OFFLINE_SCHEMES = ("file:", "data:", "blob:", "about:")  # none of these leaves the machine
SCREENSHOTS = {"index.html": "home.png", "weeks/01_prefill_decode.html": "week01.png"}
WAIT_MS = 20_000

# Rendered by the ipywidgets html-manager: each widget view it draws is a .jupyter-widgets element.
PAGE_STATE = """() => ({
    math: document.querySelectorAll('.math').length,
    typeset: document.querySelectorAll('mjx-container').length,
    views: document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]').length,
    widgets: document.querySelectorAll('.jupyter-widgets').length,
    broken_images: Array.from(document.images)
        .filter(img => !(img.complete && img.naturalWidth > 0))
        .map(img => img.getAttribute('src')),
})"""


def site_pages(html_dir: Path) -> list[Path]:
    """Every page of the site: the HTML files outside Sphinx's _static/ and _sources/."""
    return sorted(p for p in html_dir.rglob("*.html")
                  if not p.relative_to(html_dir).parts[0].startswith("_"))


def check_page(context, path: Path, wait_ms: int = WAIT_MS) -> list[str]:
    """Open one page; return what is wrong with it, one line each."""
    errors, outside = [], []
    page = context.new_page()
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    page.on("pageerror", lambda error: errors.append(f"uncaught {error}"))
    page.on("request", lambda request: request.url.startswith(OFFLINE_SCHEMES) or outside.append(request.url))
    page.on("requestfailed", lambda request: errors.append(f"{request.url} failed ({request.failure})"))
    page.goto(path.as_uri(), wait_until="load")
    # MathJax typesets after load; its startup promise settles when the page is done.
    page.evaluate("() => window.MathJax && MathJax.startup ? MathJax.startup.promise.then(() => true) : true")
    state = page.evaluate(PAGE_STATE)
    if state["views"]:
        try:
            page.wait_for_function(f"() => document.querySelectorAll('.jupyter-widgets').length >= {state['views']}",
                                   timeout=wait_ms)
        except Exception:  # playwright's TimeoutError: report the counts below
            pass
        state = page.evaluate(PAGE_STATE)
    page.close()
    problems = [f"console error: {text}" for text in errors]
    problems += [f"request outside file://: {url}" for url in outside]
    if state["math"] and state["typeset"] < state["math"]:
        problems.append(f"math not typeset: {state['typeset']} MathJax elements for {state['math']} formulas")
    if state["widgets"] < state["views"]:
        problems.append(f"widgets not rendered: {state['widgets']} drawn for {state['views']} widget views")
    problems += [f"image did not load: {src}" for src in state["broken_images"]]
    return problems


def check_site(html_dir: Path, wait_ms: int = WAIT_MS) -> dict[str, list[str]]:
    """{page: problems} for every page with a problem; screenshots saved under html_dir/screenshots."""
    from playwright.sync_api import sync_playwright

    found = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        # Block anything that would leave the machine, so that the page is checked as it is offline.
        context.route(lambda url: not url.startswith(OFFLINE_SCHEMES), lambda route: route.abort())
        for path in site_pages(html_dir):
            problems = check_page(context, path, wait_ms)
            if problems:
                found[str(path.relative_to(html_dir))] = problems
        shots = html_dir / "screenshots"
        shots.mkdir(exist_ok=True)
        for page_name, shot in SCREENSHOTS.items():
            if (html_dir / page_name).exists():
                page = context.new_page()
                page.goto((html_dir / page_name).as_uri(), wait_until="load")
                page.evaluate("() => window.MathJax && MathJax.startup ? MathJax.startup.promise : null")
                page.screenshot(path=str(shots / shot), full_page=False)
                page.close()
        browser.close()
    return found


def report(found: dict[str, list[str]]) -> str:
    return "\n".join(f"{page}: {problem}" for page, problems in found.items() for problem in problems)


def need_browser() -> None:
    if not CHROMIUM.exists():
        pytest.skip(f"no browser at {CHROMIUM}: the site's browser test needs Debian's chromium "
                    "(apt-get install chromium)")
    pytest.importorskip("playwright", reason="the site's browser test needs the playwright package (test extra)")


@pytest.fixture(scope="module")
def browsed(site):  # noqa: F811  (the imported fixture)
    need_browser()
    html_dir = site.parent
    return html_dir, check_site(html_dir)


def test_the_browser_check_finds_each_kind_of_problem(tmp_path):
    need_browser()
    (tmp_path / "broken.html").write_text(
        '<html><body><span class="math">\\(a^2\\)</span>'
        '<script type="application/vnd.jupyter.widget-view+json">{"model_id": "0"}</script>'
        '<img src="missing.png"><script>console.error("boom")</script>'
        '<script src="https://cdn.example.org/lib.js"></script></body></html>')
    problems = "\n".join(check_site(tmp_path, wait_ms=1000)["broken.html"])
    for expected in ("console error: boom", "request outside file://: https://cdn.example.org/lib.js",
                     "math not typeset: 0 MathJax elements for 1 formulas",
                     "widgets not rendered: 0 drawn for 1 widget views", "image did not load: missing.png"):
        assert expected in problems, f"{expected!r} not reported; reported:\n{problems}"


def test_every_page_works_offline_in_a_browser(browsed):
    html_dir, found = browsed
    assert len(site_pages(html_dir)) >= 4
    assert not found, "pages with problems in chromium:\n" + report(found)


def test_screenshots_of_the_home_page_and_a_lecture(browsed):
    html_dir, _ = browsed
    for shot in SCREENSHOTS.values():
        path = html_dir / "screenshots" / shot
        assert path.is_file() and path.stat().st_size > 10_000, f"{path} missing or blank"


if __name__ == "__main__":
    html = Path(sys.argv[1]).resolve()
    problems = check_site(html)
    print(report(problems) or f"{len(site_pages(html))} pages: no problems; screenshots in {html / 'screenshots'}")
    sys.exit(1 if problems else 0)
