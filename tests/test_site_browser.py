"""The built site in a real browser, offline, as a student meets it: Debian's chromium, driven by
playwright (no browser download), opens every page over file:// at a desktop's width (1400 px)
and a phone's (390 px, touch), and finds
  - no console errors and no uncaught exceptions;
  - no request that leaves file:// (each one is also blocked, so the page is truly offline);
  - math typeset (MathJax output elements for the page's math);
  - widgets rendered (a drawn widget for each widget view the page holds), and sliders, which
    cannot move a chart without a kernel, marked with a note that says to run the notebook;
  - every image loaded (naturalWidth > 0), with alt text that is not a file name;
  - nothing that scrolls sideways: neither the page nor any box in it (code, output, table);
  - figures legible: at the desktop's width the smallest text of each figure is about
    MIN_TEXT_PX tall or more as shown, and at the phone's each figure opens full size on a tap;
  - a menu that works: at 390 px a tap on the menu button opens the course's navigation and a tap
    on the contents button the page's; at 1400 px the menu button (clicked, or pressed with Enter)
    hides the sidebar and shows it again;
  - search that answers over file:// without errors.
It saves screenshots of a few pages at both widths into the build folder (SCREENSHOTS).

The smallest text of a figure is judged from its image, not read off it: infer.plotting draws no
text under MIN_FONT_PT (save_figure enforces it), so a figure saved at `dpi` (the PNG says which)
and shown at `shown` px of its `natural` px has letters at least MIN_FONT_PT / 72 * dpi * shown /
natural px tall.

It uses the students' site that tests/test_site.py builds (one build per test process). To check
a site built by `make site`, and keep its screenshots (optimized) for reviewers:

    python -m tests.test_site_browser _build/html [--screenshots site/screenshots]
"""

import argparse
import base64
import sys
from io import BytesIO
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from infer.plotting import MIN_FONT_PT, MIN_TEXT_PX
from tests.test_site import site  # noqa: F401  (the session fixture: the site is built once)

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
OFFLINE_SCHEMES = ("file:", "data:", "blob:", "about:")  # none of these leaves the machine
DESKTOP = {"viewport": {"width": 1400, "height": 900}}
PHONE = {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True}
SCREENSHOTS = {
    "index.html": "home",
    "start.html": "start",
    "weeks/06_chunked_prefill.html": "week06",
    "labs/06_chunked_prefill.html": "lab06",
}
SEARCH_WORD = "lab"  # on every page of the site's home table
TEXT_PX_SLACK = 0.5  # "about" MIN_TEXT_PX: a figure a few pixels over the column is no failure
WAIT_MS = 20_000

# Rendered by the ipywidgets html-manager: each widget view it draws is a .jupyter-widgets element.
PAGE_STATE = """() => {
    const state = document.querySelector('script[type="application/vnd.jupyter.widget-state+json"]');
    const models = state ? Object.values(JSON.parse(state.textContent).state) : [];
    const root = document.scrollingElement;
    const describe = el => `<${el.tagName.toLowerCase()} class="${el.className}">`;
    // A display equation may scroll in its own box on a phone: MathJax 3 cannot break it into lines.
    const sideways = Array.from(document.querySelectorAll('body *:not(mjx-container)')).filter(el => {
        const overflow = getComputedStyle(el).overflowX;
        return (overflow === 'auto' || overflow === 'scroll') && el.scrollWidth > el.clientWidth + 1;
    });
    const tooWide = Array.from(document.querySelectorAll('body *'))
        .filter(el => el.getBoundingClientRect().right > innerWidth + 1);
    const widest = tooWide.filter(el => !Array.from(el.children).some(child => tooWide.includes(child)));
    return {
        math: document.querySelectorAll('.math').length,
        typeset: document.querySelectorAll('mjx-container').length,
        views: document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]').length,
        widgets: document.querySelectorAll('.jupyter-widgets').length,
        sliders: models.filter(m => /SliderModel$/.test(m.model_name)).length,
        slider_notes: Array.from(document.querySelectorAll('p'))
            .filter(p => p.textContent.includes('Run this notebook in Jupyter to move the sliders')).length,
        page_overflow: root.scrollWidth - root.clientWidth,
        past_the_edge: widest.slice(0, 3).map(describe),
        sideways: sideways.map(el => `${describe(el)}: ${el.scrollWidth - el.clientWidth} px beyond its box`),
        images: Array.from(document.images).map(img => ({
            src: img.currentSrc || img.src, attribute: img.getAttribute('src').slice(0, 80), alt: img.alt,
            drawn_by_widget: img.closest('.jupyter-widgets') !== null,
            loaded: img.complete && img.naturalWidth > 0, natural: img.naturalWidth, shown: img.clientWidth,
            full_size_link: (img.closest('a') || {}).href === (img.currentSrc || img.src),
        })),
    };
}"""


def site_pages(html_dir: Path) -> list[Path]:
    """Every page of the site: the HTML files outside Sphinx's _static/ and _sources/."""
    return sorted(
        p for p in html_dir.rglob("*.html") if not p.relative_to(html_dir).parts[0].startswith(("_", "screenshots"))
    )


def saved_dpi(src: str) -> float:
    """The resolution a PNG (a file, or a data: URL) says it was saved at (matplotlib writes it), 72
    if it says none."""
    from PIL import Image

    png = BytesIO(base64.b64decode(src.split(",", 1)[1])) if src.startswith("data:") else unquote(urlparse(src).path)
    with Image.open(png) as image:
        return float(image.info.get("dpi", (72, 72))[0])


def smallest_text_px(dpi: float, natural: int, shown: int) -> float:
    return MIN_FONT_PT / 72 * dpi * shown / natural


def figure_problems(images: list[dict], phone: bool) -> list[str]:
    problems = []
    for image in images:
        if not image["loaded"]:
            problems.append(f"image did not load: {image['attribute']}")
            continue
        # The widget renderer gives the figures it draws no alt text; the notebook's can have one.
        described = image["alt"] and image["alt"] not in image["attribute"] and not image["alt"].endswith(".png")
        if not described and not image["drawn_by_widget"]:
            problems.append(f"image without alt text saying what it shows: {image['attribute']}")
        is_png = image["src"].endswith(".png") or image["src"].startswith("data:image/png")
        if not is_png or not image["shown"]:
            continue  # not a figure, or not on screen
        dpi = saved_dpi(image["src"])
        if phone:
            if not image["full_size_link"]:
                problems.append(f"figure does not open full size on a tap: {image['attribute']}")
            shown = image["natural"]  # a tap shows it at its own size
        else:
            shown = image["shown"]
        text_px = smallest_text_px(dpi, image["natural"], shown)
        if text_px < MIN_TEXT_PX - TEXT_PX_SLACK:
            problems.append(
                f"figure text {text_px:.1f} px tall, under {MIN_TEXT_PX} px ({image['natural']} px wide "
                f"at {dpi:.0f} dpi, shown {shown} px wide): {image['attribute']}"
            )
    return problems


SIDEBAR_SHOWN = """() => { const sidebar = document.querySelector('#pst-primary-sidebar');
    return sidebar !== null && sidebar.getBoundingClientRect().right > 0; }"""
OPEN_MENU_LINKS = """() => Array.from(document.querySelectorAll('dialog[open] a'))
    .filter(link => link.getBoundingClientRect().width > 0).length"""


def waited_for(page, condition: str) -> bool:
    """Whether `condition` (a JavaScript function) turns true within 2 s: the theme animates."""
    try:
        page.wait_for_function(condition, timeout=2000)
        return True
    except Exception:  # playwright's TimeoutError
        return False


def menu_problems(page, phone: bool) -> list[str]:
    """At 390 px, tap the menu and contents buttons: each opens a dialog of links, which Escape
    closes. At 1400 px, click the menu button, then press Enter on it: each time the sidebar slides
    out and back in."""
    menu, contents = page.locator(".primary-toggle:visible"), page.locator(".secondary-toggle:visible")
    if menu.count() != 1:
        return [f"{menu.count()} visible menu buttons, expected 1"]
    problems = []
    if phone:
        for name, button in (("menu", menu), ("contents", contents)):
            if button.count():
                button.first.tap()
                if not waited_for(page, OPEN_MENU_LINKS):
                    problems.append(f"tapping the {name} button opened nothing at 390 px")
                page.keyboard.press("Escape")
                waited_for(page, "() => !document.querySelector('dialog[open]')")
        return problems
    if not page.evaluate(SIDEBAR_SHOWN):
        return ["the sidebar is not shown at 1400 px"]
    for press in (menu.first.click, lambda: menu.first.press("Enter")):
        press()
        hidden = waited_for(page, f"() => !({SIDEBAR_SHOWN})()")
        press()
        if not (hidden and waited_for(page, SIDEBAR_SHOWN)):
            return ["the menu button does not hide and show the sidebar at 1400 px"]
    return problems


def check_page(context, path: Path, phone: bool, wait_ms: int = WAIT_MS) -> list[str]:
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
            page.wait_for_function(
                f"() => document.querySelectorAll('.jupyter-widgets').length >= {state['views']}", timeout=wait_ms
            )
        except Exception:  # playwright's TimeoutError: report the counts below
            pass
        state = page.evaluate(PAGE_STATE)
    problems = menu_problems(page, phone)
    page.close()
    problems += [f"console error: {text}" for text in errors]
    problems += [f"request outside file://: {url}" for url in outside]
    if state["math"] and state["typeset"] < state["math"]:
        problems.append(f"math not typeset: {state['typeset']} MathJax elements for {state['math']} formulas")
    if state["widgets"] < state["views"]:
        problems.append(f"widgets not rendered: {state['widgets']} drawn for {state['views']} widget views")
    if state["sliders"] and not state["slider_notes"]:
        problems.append("sliders without a note that they need Jupyter to move anything")
    if state["page_overflow"] > 0:
        problems.append(
            f"the page scrolls sideways by {state['page_overflow']} px, past the edge: "
            + ", ".join(state["past_the_edge"])
        )
    problems += [f"scrolls sideways: {box}" for box in state["sideways"]]
    return problems + figure_problems(state["images"], phone)


def check_search(context, html_dir: Path, wait_ms: int = WAIT_MS) -> list[str]:
    """Search for SEARCH_WORD on the site's search page, over file://; what went wrong."""
    errors = []
    page = context.new_page()
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    page.on("pageerror", lambda error: errors.append(f"uncaught {error}"))
    page.goto(f"{(html_dir / 'search.html').as_uri()}?q={SEARCH_WORD}", wait_until="load")
    try:
        page.wait_for_function("() => document.querySelectorAll('#search-results li').length > 0", timeout=wait_ms)
    except Exception:  # playwright's TimeoutError: reported below
        pass
    page.wait_for_timeout(500)  # the time a result's snippet fetch takes to fail
    found = page.locator("#search-results li").count()
    page.close()
    problems = [f"console error while searching: {text}" for text in errors]
    return problems + ([] if found else [f"searching for {SEARCH_WORD!r} found nothing"])


def save_screenshot(page, path: Path) -> None:
    """A PNG of the page as first shown, in 256 colours: a few dozen KB instead of a few hundred."""
    from PIL import Image

    image = Image.open(BytesIO(page.screenshot(full_page=False))).convert("RGB")
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def check_site(html_dir: Path, wait_ms: int = WAIT_MS, screenshots: Path | None = None) -> dict[str, list[str]]:
    """{page (at width): problems} for every page with a problem; screenshots saved under
    `screenshots` (default html_dir/screenshots)."""
    from playwright.sync_api import sync_playwright

    found = {}
    shots = screenshots or html_dir / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)
        for device, options in (("1400 px", DESKTOP), ("390 px", PHONE)):
            context = browser.new_context(**options)
            # Block anything that would leave the machine, so that the page is checked as it is offline.
            context.route(lambda url: not url.startswith(OFFLINE_SCHEMES), lambda route: route.abort())
            for path in site_pages(html_dir):
                problems = check_page(context, path, options is PHONE, wait_ms)
                if problems:
                    found[f"{path.relative_to(html_dir)} at {device}"] = problems
            if (html_dir / "search.html").exists():
                problems = check_search(context, html_dir, wait_ms)
                if problems:
                    found[f"search.html?q={SEARCH_WORD} at {device}"] = problems
            for page_name, shot in SCREENSHOTS.items():
                if (html_dir / page_name).exists():
                    page = context.new_page()
                    page.goto((html_dir / page_name).as_uri(), wait_until="load")
                    page.evaluate("() => window.MathJax && MathJax.startup ? MathJax.startup.promise : null")
                    save_screenshot(page, shots / f"{shot}_{options['viewport']['width']}.png")
                    page.close()
            context.close()
        browser.close()
    return found


def report(found: dict[str, list[str]]) -> str:
    return "\n".join(f"{page}: {problem}" for page, problems in found.items() for problem in problems)


def need_browser() -> None:
    if not CHROMIUM.exists():
        pytest.skip(
            f"no browser at {CHROMIUM}: the site's browser test needs Debian's chromium (apt-get install chromium)"
        )
    pytest.importorskip("playwright", reason="the site's browser test needs the playwright package (test extra)")


@pytest.fixture(scope="module")
def browsed(site):  # noqa: F811  (the imported fixture)
    need_browser()
    html_dir = site.parent
    return html_dir, check_site(html_dir)


BROKEN_PAGE = """<html><body>
<button class="primary-toggle">menu</button><dialog id="pst-primary-sidebar-modal"><a href="#">week 01</a></dialog>
<span class="math">\\(a^2\\)</span>
<script type="application/vnd.jupyter.widget-state+json">
  {"version_major": 2, "version_minor": 0, "state": {"0": {"model_name": "IntSliderModel", "state": {}}}}
</script>
<script type="application/vnd.jupyter.widget-view+json">{"model_id": "0"}</script>
<img src="missing.png" alt="a chart">
<div style="width: 300px"><pre style="overflow-x: auto">{wide}</pre></div>
<img src="wide.png" alt="wide.png" style="width: 600px">
<script>console.error("boom")</script>
<script src="https://cdn.example.org/lib.js"></script>
</body></html>"""


def test_the_browser_check_finds_each_kind_of_problem(tmp_path):
    """A page that plants every problem the check looks for: each one is reported."""
    from PIL import Image

    need_browser()
    Image.new("RGB", (2000, 600), "white").save(tmp_path / "wide.png", dpi=(120, 120))
    (tmp_path / "broken.html").write_text(BROKEN_PAGE.replace("{wide}", "x" * 400))
    found = check_site(tmp_path, wait_ms=1000)
    problems = "\n".join(found["broken.html at 1400 px"])
    for expected in (
        "console error: boom",
        "request outside file://: https://cdn.example.org/lib.js",
        "math not typeset: 0 MathJax elements for 1 formulas",
        "widgets not rendered: 0 drawn for 1 widget views",
        "image did not load: missing.png",
        "sliders without a note",
        'scrolls sideways: <pre class="">',
        "image without alt text saying what it shows: wide.png",
        "figure text 4.0 px tall, under 9 px (2000 px wide at 120 dpi, shown 600 px wide): wide.png",
        "the sidebar is not shown at 1400 px",
    ):
        assert expected in problems, f"{expected!r} not reported; reported:\n{problems}"
    on_phone = "\n".join(found["broken.html at 390 px"])
    for expected in (
        "tapping the menu button opened nothing at 390 px",
        "figure does not open full size on a tap: wide.png",
    ):
        assert expected in on_phone, f"{expected!r} not reported; reported:\n{on_phone}"


def test_every_page_works_offline_in_a_browser(browsed):
    html_dir, found = browsed
    assert len(site_pages(html_dir)) >= 4
    assert not found, "pages with problems in chromium:\n" + report(found)


def test_screenshots_of_the_pages_reviewers_look_at(browsed):
    html_dir, _ = browsed
    for page_name, shot in SCREENSHOTS.items():
        if (html_dir / page_name).exists():
            for width in (1400, 390):
                path = html_dir / "screenshots" / f"{shot}_{width}.png"
                assert path.is_file() and path.stat().st_size > 5_000, f"{path} missing or blank"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Check a built site in chromium, offline; save screenshots.")
    parser.add_argument("html", type=Path)
    parser.add_argument("--screenshots", type=Path, default=None, help="where to save them (default: HTML/screenshots)")
    args = parser.parse_args()
    html = args.html.resolve()
    problems = check_site(html, screenshots=args.screenshots)
    print(report(problems) or f"{len(site_pages(html))} pages at 1400 and 390 px: no problems")
    sys.exit(1 if problems else 0)
