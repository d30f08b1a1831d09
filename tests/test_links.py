"""Every relative link in the notebooks and the site's pages resolves, to a file and a heading
(site/links.py), so that a renumbered section fails here, in seconds, and not at the end of
`make site`. The checker's slugs are checked against the ids of a built page in test_site.py."""

import importlib.util
import shutil

import nbformat
import pytest
from nbformat.v4 import new_markdown_cell, new_notebook

from infer.paths import REPO_ROOT


def load_links_module():
    spec = importlib.util.spec_from_file_location("site_links", REPO_ROOT / "site" / "links.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


links = load_links_module()


def test_every_link_of_the_course_resolves():
    broken = links.broken_links(links.course_sources(), links.course_home_page())
    assert not broken, "broken links (fix them in solutions/, then `make labs`):\n" + "\n".join(map(str, broken))


def test_the_check_covers_lectures_labs_solutions_and_pages():
    folders = {p.parent.name for p in links.course_sources()}
    assert folders == {"weeks", "labs", "solutions", "pages"}


def plant(tmp_path, link: str):
    """A copy of week 07's lecture, and a lab beside it whose one link is `link`."""
    (tmp_path / "weeks").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "weeks" / "07_serving.ipynb", tmp_path / "weeks" / "07_serving.ipynb")
    lab = tmp_path / "labs" / "07_serving.ipynb"
    lab.parent.mkdir()
    nbformat.write(new_notebook(cells=[new_markdown_cell(f"# Lab\n\nIn the lecture: [the view]({link}).")]), lab)
    return lab


def test_a_stale_anchor_is_named_with_the_nearest_heading(tmp_path):
    lab = plant(tmp_path, "../weeks/07_serving.ipynb#6-the-servers-own-view")
    [broken] = links.broken_links([lab])
    message = str(broken)
    assert str(lab) in message and "#6-the-servers-own-view" in message
    assert "the nearest is #7-the-servers-own-view" in message, message


def test_a_missing_file_is_named(tmp_path):
    lab = plant(tmp_path, "../weeks/09_missing.ipynb#1-anything")
    [broken] = links.broken_links([lab])
    assert "09_missing.ipynb" in str(broken) and "does not exist" in str(broken)


def test_a_good_anchor_and_an_outside_link_pass(tmp_path):
    lab = plant(tmp_path, "../weeks/07_serving.ipynb#7-the-servers-own-view")
    assert links.broken_links([lab]) == []
    outside = plant(tmp_path / "other", "https://docs.vllm.ai/en/latest/#no-such-heading-here")
    assert links.broken_links([outside]) == []


def test_repeated_headings_get_numbered_slugs_as_on_the_site(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Notes\n\n## Notes\n\n### Math $x^2$ and `code`\n", encoding="utf-8")
    assert links.anchors(page) == ("title", "notes", "notes-1", "math--and-code")


@pytest.mark.parametrize("target", ["start.md", "weeks/00_setup.ipynb"])
def test_a_page_links_from_the_sites_root(target):
    page = links.PAGES_DIR / "grading.md"
    assert links.check_link(page, target) is None
