"""Every relative link of the course resolves: the file exists and its #anchor names a heading there.

    python site/links.py          # prints each broken link; exits 1 if there is one

Sphinx finds a broken cross-reference only at the end of `make site`, after every lecture has run.
This check reads the committed notebooks (lectures, labs, solutions) and the site's own pages
(site/pages/*.md and the generated home page) in a second, with the parser and the heading slugs
that the site builder uses (myst-parser's markdown-it, GitHub-style slugs, made unique within a
page, headings down to `myst_heading_anchors`), so the two cannot disagree on what an anchor is.

Paths resolve as they do on the site: a notebook's links against its own folder, a page's against
the site's root, where the pages sit beside weeks/, labs/, solutions/ and figures/.
"""

import difflib
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat
from markdown_it.renderer import RendererHTML
from markdown_it.tree import SyntaxTreeNode
from myst_parser.config.main import MdParserConfig
from myst_parser.mdit_to_docutils.base import compute_unique_slug
from myst_parser.parsers.mdit import create_md_parser

SITE_DIR = Path(__file__).resolve().parent
REPO_ROOT = SITE_DIR.parent
sys.path.insert(0, str(SITE_DIR))
sys.path.insert(0, str(REPO_ROOT))

import conf  # noqa: E402  (the site's Sphinx configuration: its markdown extensions and anchor depth)
from build import PAGES_DIR, SECTIONS, home_page  # noqa: E402

NOTEBOOK_FOLDERS = SECTIONS
SITE_FOLDERS = (*SECTIONS, "figures")  # the folders a page reaches from the site's root


@dataclass(frozen=True)
class BrokenLink:
    source: Path
    link: str
    problem: str

    def __str__(self) -> str:
        return f"{shown(self.source)}: ({self.link}) {self.problem}"


def shown(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path)


@cache
def markdown_parser():
    config = MdParserConfig(
        enable_extensions=set(conf.myst_enable_extensions), heading_anchors=conf.myst_heading_anchors
    )
    return create_md_parser(config, RendererHTML)


def markdown_texts(path: Path) -> list[str]:
    """The markdown of a page, or of each markdown cell of a notebook, in order."""
    if path.suffix == ".ipynb":
        notebook = nbformat.read(path, as_version=4)
        return [cell.source for cell in notebook.cells if cell.cell_type == "markdown"]
    return [path.read_text(encoding="utf-8")]


def syntax_trees(texts: list[str]):
    for text in texts:
        yield SyntaxTreeNode(markdown_parser().parse(text))


@cache
def anchors(path: Path) -> tuple[str, ...]:
    """The heading anchors of one page, in order, as the site builder makes them."""
    slugs: list[str] = []
    for tree in syntax_trees(markdown_texts(path)):
        for node in tree.walk():
            if node.type == "heading" and int(node.tag[1:]) <= conf.myst_heading_anchors:
                slug = compute_unique_slug(node, slugs)
                if slug:
                    slugs.append(slug)
    return tuple(slugs)


def links(texts: list[str]) -> list[str]:
    """Every link and image target in the markdown."""
    found = []
    for tree in syntax_trees(texts):
        for node in tree.walk():
            if node.type == "link":
                found.append(str(node.attrs["href"]))
            elif node.type == "image":
                found.append(str(node.attrs["src"]))
    return found


def site_target(source: Path, path: str) -> Path:
    """Where a relative link of `source` points in the repository, as the site lays it out."""
    if source.parent == PAGES_DIR or source.name == "index.md":
        first = Path(path).parts[0]
        return (REPO_ROOT / path) if first in SITE_FOLDERS else (PAGES_DIR / path)
    return source.parent / path


def check_link(source: Path, link: str) -> BrokenLink | None:
    parts = urlsplit(link)
    if parts.scheme or parts.netloc:  # http(s), mailto: outside the course
        return None
    target = site_target(source, unquote(parts.path)).resolve() if parts.path else source
    if not target.exists():
        return BrokenLink(source, link, f"points to {shown(target)}, which does not exist")
    if not parts.fragment or target.suffix not in (".ipynb", ".md"):
        return None
    headings = anchors(target)
    if parts.fragment in headings:
        return None
    nearest = difflib.get_close_matches(parts.fragment, headings, n=1, cutoff=0.0)
    hint = f"; the nearest is #{nearest[0]}" if nearest else "; it has no headings"
    return BrokenLink(source, link, f"names no heading of {shown(target)}{hint}")


def broken_links(sources: list[Path], home_page_text: str | None = None) -> list[BrokenLink]:
    """The broken links of `sources` and, if given, of the generated home page."""
    broken = [b for source in sources for link in links(markdown_texts(source)) if (b := check_link(source, link))]
    if home_page_text is not None:
        home = REPO_ROOT / "index.md"  # where it sits on the site: its links resolve from the root
        broken += [b for link in links([home_page_text]) if (b := check_link(home, link))]
    return broken


def course_sources() -> list[Path]:
    notebooks = sorted(p for folder in NOTEBOOK_FOLDERS for p in (REPO_ROOT / folder).glob("*.ipynb"))
    return notebooks + sorted(PAGES_DIR.glob("*.md"))


def course_home_page() -> str:
    """The instructors' home page (it links every notebook the students' one does, and the solutions)."""
    available = {f"{p.parent.name}/{p.name}" for p in course_sources() if p.suffix == ".ipynb"}
    return home_page(available, [p.stem for p in sorted(PAGES_DIR.glob("*.md"))])


def main() -> None:
    broken = broken_links(course_sources(), course_home_page())
    for link in broken:
        print(link)
    print(f"{len(broken)} broken link(s)" if broken else "every link resolves")
    sys.exit(1 if broken else 0)


if __name__ == "__main__":
    main()
