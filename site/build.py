"""Build the course's static HTML site from notebooks that already carry their outputs.

    python site/build.py --notebooks DIR --out DIR [--with-solutions]

--notebooks holds weeks/, labs/ and solutions/ (the repository root, or an executed copy such
as _build/notebooks). The students' site has the lectures and labs; --with-solutions makes the
instructors' site, which adds the solutions. The script
  1. assembles a Sphinx source tree next to --out: the notebooks named in the syllabus, each
     figure given the alt text that site/figure_alt.json holds for it, the pages of site/pages/
     (getting started, grading) and a home page whose table and sidebar, in course order (each
     lecture, then its lab), are generated from infer.course.syllabus.WEEKS;
  2. runs sphinx-build -W (any warning fails the build), with site/ as configuration folder;
  3. copies MathJax, require.js and the ipywidgets renderer into the site: by default the
     pages load them from CDNs, and offline the math stays raw and the widgets blank. They
     come from their npm packages, fetched once with `npm pack` into a cache under _build/;
  4. fails if any page still loads a script or stylesheet from http(s)://.
"""

import argparse
import html.parser
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import nbformat

SITE_DIR = Path(__file__).resolve().parent
REPO_ROOT = SITE_DIR.parent
sys.path.insert(0, str(REPO_ROOT))  # so that `infer` imports without an installed package

from infer.course.syllabus import WEEKS  # noqa: E402

DEFAULT_VENDOR_CACHE = REPO_ROOT / "_build" / "site_vendor"

# npm package -> (pinned version, {path in the package: path under _static/offline/}).
# MathJax 3, not 4: see conf.py. html-manager 1.0.x renders ipywidgets 8 state; its embed-amd
# bundle needs require.js. The font files are Font Awesome, for widget icons.
VENDORED = {
    "mathjax": ("3.2.2", {"es5": "mathjax"}),
    "requirejs": ("2.3.7", {"require.js": "require.js"}),
    "@jupyter-widgets/html-manager": ("1.0.15", {"dist": "html-manager"}),
}
# Left out of the copies: source maps; html-manager's other bundles (pages load embed-amd.js); MathJax's.
NOT_NEEDED = ("*.map", "embed.js*", "libembed-amd.js", "tex-svg*.js", "tex-chtml*.js", "mml-*.js", "node-main.js")
SECTIONS = ("weeks", "labs", "solutions")  # a week's pages, in the order the sidebar lists them
STUDENT_SECTIONS = ("weeks", "labs")  # the solutions only go to the instructors' site
PAGES_DIR = SITE_DIR / "pages"  # markdown pages: the start page first in the sidebar, the others last
START_PAGE = "start"
# The start page's clone command names the repository: --repository, else the checkout's origin.
REPOSITORY_PLACEHOLDER = "@REPOSITORY@"
UNKNOWN_REPOSITORY = "<URL of the course repository>"

# Alt text of each figure, by the name the notebook saves or shows it under (figures/<name>.png).
FIGURE_ALT = json.loads((SITE_DIR / "figure_alt.json").read_text(encoding="utf-8"))
FIGURE_NAME = re.compile(r'save_figure\(\w+, "(?P<saved>\w+)"|"(?P<shown>\w+)\.png"')


def fetch_vendor_packages(cache: Path) -> dict[str, Path]:
    """Unpack each pinned npm package into cache/<name>-<version>/ unless it is already there."""
    unpacked = {}
    for name, (version, _) in VENDORED.items():
        target = cache / f"{name.replace('/', '__')}-{version}"
        if not (target / "package.json").exists():
            if shutil.which("npm") is None:
                sys.exit(
                    "site build: npm is needed once to fetch MathJax, require.js and the "
                    f"ipywidgets renderer into {cache} (install Node.js, or copy that cache)"
                )
            with tempfile.TemporaryDirectory() as tmp:
                print(f"fetching {name}@{version} with npm", flush=True)
                npm = subprocess.run(
                    ["npm", "pack", "--silent", "--pack-destination", tmp, f"{name}@{version}"],
                    stdout=subprocess.DEVNULL,
                )
                if npm.returncode != 0:
                    sys.exit(f"site build: npm could not fetch {name}@{version} (is the npm registry reachable?)")
                (tarball,) = Path(tmp).glob("*.tgz")
                with tarfile.open(tarball) as tar:
                    # the "data" filter (no links out, no odd files) exists from Python 3.11.4
                    safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
                    tar.extractall(tmp, **safe)
                shutil.rmtree(target, ignore_errors=True)
                shutil.copytree(Path(tmp) / "package", target)  # npm tarballs hold package/
        unpacked[name] = target
    return unpacked


def copy_vendor_files(unpacked: dict[str, Path], static_dir: Path) -> None:
    for name, (_, files) in VENDORED.items():
        for source, destination in files.items():
            source, destination = unpacked[name] / source, static_dir / "offline" / destination
            destination.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, destination, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*NOT_NEEDED))
            else:
                shutil.copy2(source, destination)


def home_page(available: set[str], pages: list[str] = ()) -> str:
    """The syllabus table and the sidebar, as MyST markdown. The sidebar (and previous/next) follows
    the course: the start page, then each week's lecture, lab and (on the instructors' site)
    solution, then the other pages. A notebook not in `available` is listed as coming."""

    def link(section: str, week, text: str) -> str:
        path = f"{section}/{week.notebook_name}"
        return f"[{text}]({path})" if path in available else f"{text} (coming)"

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    with_solutions = any(p.startswith("solutions/") for p in available)
    lines = [
        "# LLM inference, from a naive generate() loop to chunked prefill",
        "",
        "A hands-on course, one week at a time: a lecture that measures what it explains on your own",
        "machine, then a lab where you build the piece it taught and a check tells you at once whether",
        "it works. A laptop CPU runs all of it; a GPU runs it at scale.",
        "",
    ]
    if START_PAGE in pages:
        lines += [
            f"**New here? [Getting started]({START_PAGE}.md)** says who the course is for, what you "
            "need to know and to run it, how to get the code and open the labs, and how to work "
            "through a week.",
            "",
        ]
    lines += [
        "| Week | Lecture | Lab |",
        "|------|---------|-----|",
    ]
    for week in WEEKS:
        lecture = f"**{cell(week.title)}**: {cell(week.lecture)} → {link('weeks', week, 'lecture')}"
        lab = "-"
        if week.lab:
            lab = f"{cell(week.lab)} → {link('labs', week, 'lab')}"
            if with_solutions:
                lab += f", {link('solutions', week, 'solution')}"
        lines.append(f"| {week.number} | {lecture} | {lab} |")

    def toctree(caption: str, entries: list[str]) -> list[str]:
        return ["", "```{toctree}", ":hidden:", f":caption: {caption}", "", *entries, "```"] if entries else []

    in_course_order = [
        p for week in WEEKS for section in SECTIONS if (p := f"{section}/{week.notebook_name}") in available
    ]
    lines += toctree("Start here", [p for p in pages if p == START_PAGE])
    lines += toctree("Weeks: lecture, then lab", in_course_order)
    lines += toctree("Course", [p for p in pages if p != START_PAGE])
    return "\n".join(lines) + "\n"


def describe_figures(notebook: nbformat.NotebookNode, where: str) -> None:
    """Give each cell that shows a figure the alt text of that figure (myst-nb reads it from the
    cell's metadata, mystnb.image.alt), found by the name the cell saves or shows it under. Alt text
    the cell already has is kept. A figure without a description stops the build: without one the
    page would offer a screen reader the image's hashed file name."""
    for cell in notebook.cells:
        if cell.cell_type != "code" or not any("image/png" in o.get("data", {}) for o in cell.outputs):
            continue
        image = cell.metadata.setdefault("mystnb", {}).setdefault("image", {})
        if "alt" in image:
            continue
        names = {match["saved"] or match["shown"] for match in FIGURE_NAME.finditer(cell.source)}
        if len(names) != 1 or not names <= FIGURE_ALT.keys():
            sys.exit(
                f"site build: {where}, cell {cell.get('id')}: a figure without a description. The cell "
                f"names {sorted(names) or 'no figure'}; save one figure per cell under a name and say what "
                f"it shows in {SITE_DIR / 'figure_alt.json'}"
            )
        image["alt"] = FIGURE_ALT[names.pop()]


def origin_url() -> str | None:
    """The URL the checkout was cloned from, if it was."""
    found = subprocess.run(["git", "-C", str(REPO_ROOT), "remote", "get-url", "origin"], capture_output=True, text=True)
    return found.stdout.strip() or None


def assemble_source(notebooks: Path, source: Path, with_solutions: bool = False, repository: str | None = None) -> None:
    """Copy the syllabus's notebooks that exist (no solutions unless `with_solutions`) with their
    figures described, the figures and the course pages (the start page naming `repository`);
    write the home page."""
    available = set()
    for section in SECTIONS:
        if section not in STUDENT_SECTIONS and not with_solutions:
            continue
        for week in WEEKS:
            path = notebooks / section / week.notebook_name
            if path.exists():
                notebook = nbformat.read(path, as_version=4)
                describe_figures(notebook, f"{section}/{week.notebook_name}")
                (source / section).mkdir(parents=True, exist_ok=True)
                nbformat.write(notebook, source / section / week.notebook_name)
                available.add(f"{section}/{week.notebook_name}")
    if not available:
        sys.exit(f"site build: no syllabus notebook found under {notebooks}/(weeks|labs|solutions)")
    # Markdown cells may show committed figures, ![...](../figures/x.png): keep that path valid.
    if (REPO_ROOT / "figures").is_dir():
        shutil.copytree(REPO_ROOT / "figures", source / "figures")
    pages = []
    for page in sorted(PAGES_DIR.glob("*.md")):
        text = page.read_text(encoding="utf-8").replace(REPOSITORY_PLACEHOLDER, repository or UNKNOWN_REPOSITORY)
        (source / page.name).write_text(text, encoding="utf-8")
        pages.append(page.stem)
    (source / "index.md").write_text(home_page(available, pages), encoding="utf-8")


class RemoteAssetFinder(html.parser.HTMLParser):
    """Collects the http(s) URLs of <script src> and <link rel=stylesheet|preload> tags."""

    def __init__(self):
        super().__init__()
        self.remote = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        url = None
        if tag == "script":
            url = attrs.get("src")
        elif tag == "link" and {"stylesheet", "preload", "modulepreload"} & set((attrs.get("rel") or "").split()):
            url = attrs.get("href")
        if url and url.strip().lower().startswith(("http://", "https://", "//")):
            self.remote.append(url)


def remote_assets(html_dir: Path) -> list[tuple[Path, str]]:
    found = []
    for page in sorted(html_dir.rglob("*.html")):
        finder = RemoteAssetFinder()
        finder.feed(page.read_text(encoding="utf-8"))
        found += [(page.relative_to(html_dir), url) for url in finder.remote]
    return found


def build_site(
    notebooks: Path,
    out: Path,
    vendor_cache: Path = DEFAULT_VENDOR_CACHE,
    with_solutions: bool = False,
    repository: str | None = None,
) -> Path:
    notebooks, out = notebooks.resolve(), out.resolve()
    work = out.parent / f"{out.name}_sphinx"  # assembled source tree and Sphinx's doctrees
    unpacked = fetch_vendor_packages(vendor_cache)
    # Start afresh: Sphinx would keep the pages of removed notebooks, and trust its doctrees
    # for notebooks copied with their old modification times.
    shutil.rmtree(work, ignore_errors=True)
    if (out / ".buildinfo").exists():  # only ever delete a folder that Sphinx made
        shutil.rmtree(out)
    assemble_source(notebooks, work / "source", with_solutions, repository or origin_url())
    sphinx = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-q",
            "-b",
            "html",
            "-c",
            str(SITE_DIR),
            "-d",
            str(work / "doctrees"),
            str(work / "source"),
            str(out),
        ]
    )
    if sphinx.returncode != 0:
        sys.exit(
            f"site build: sphinx-build failed; each warning above counts as an error (-W). "
            f"The notebooks under {work / 'source'} are copies of those in {notebooks}."
        )
    copy_vendor_files(unpacked, out / "_static")
    remote = remote_assets(out)
    if remote:
        sys.exit(
            "site build: pages load remote scripts or stylesheets (they break offline):\n"
            + "\n".join(f"  {page}: {url}" for page, url in remote)
        )
    return out / "index.html"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--notebooks",
        type=Path,
        default=REPO_ROOT,
        help="folder with weeks/, labs/, solutions/ (default: the repository)",
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "_build" / "html")
    parser.add_argument(
        "--vendor-cache",
        type=Path,
        default=DEFAULT_VENDOR_CACHE,
        help="where the npm packages are unpacked once and reused",
    )
    parser.add_argument(
        "--with-solutions",
        action="store_true",
        help="the instructors' site: add the solutions (the students' site has none)",
    )
    parser.add_argument(
        "--repository",
        default=None,
        help="the git URL the start page tells students to clone (default: this checkout's origin)",
    )
    args = parser.parse_args()
    index = build_site(args.notebooks, args.out, args.vendor_cache, args.with_solutions, args.repository)
    print(
        f"Site built: {index}\n"
        f"Open that file, or serve the folder (search then shows text snippets too):\n"
        f"  python -m http.server -d {index.parent}   # then open http://127.0.0.1:8000"
    )


if __name__ == "__main__":
    main()
