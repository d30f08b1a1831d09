"""Sphinx configuration of the course site. Run it through `python site/build.py`, which
assembles the source tree (notebooks + generated home page) and fetches the JavaScript
libraries that this file points at; see build.py for the why of each vendored file."""

project = "LLM inference, from a naive generate() loop to chunked prefill"
author = "the course authors"
copyright = "the course authors"

extensions = ["myst_nb"]
# $a^2$ and $$...$$ in markdown cells; "- [ ]" checklists drawn as checkboxes, not as literal brackets.
myst_enable_extensions = ["dollarmath", "amsmath", "tasklist"]
# Anchors for headings down to ###, so that a lab can link to a lecture's numbered sections
# (../weeks/06_chunked_prefill.ipynb#3-the-chunked-step-as-vllm-v1-schedules-it).
myst_heading_anchors = 3

# Render the outputs stored in the notebooks; never run a kernel while building the site.
nb_execution_mode = "off"

html_theme = "sphinx_book_theme"
html_title = "LLM inference"
html_theme_options = {
    "home_page_in_toc": True,
    "show_toc_level": 2,
    # No header bar above the book: pydata-sphinx-theme (>= 0.16) fills an unset navbar_persistent
    # with a search field, which makes it draw its header, holding a second search box and hidden
    # copies of the menu buttons placed before sphinx-book-theme's own; its script binds the first
    # button of each kind, the hidden copy, so the visible menu buttons did nothing. With the header
    # empty the theme skips it, and every menu button on the page is one the reader can press.
    "navbar_persistent": [],
}
# The theme reads the light/dark mode from localStorage, which is empty on a first visit: without
# a default it logs "Got invalid theme mode" in the console of every new reader.
html_context = {"default_mode": "auto"}
# Our own files; the npm libraries are copied into _static/offline/ by build.py. course.css wraps wide
# code and fits tables and figures to the column; course.js makes figures open full size, keeps search
# from fetching pages where a file:// page cannot, and says where widgets need a kernel.
html_static_path = ["static"]
html_css_files = ["course.css"]
html_js_files = ["course.js"]

# Everything below is served from the site itself, so that pages work offline. The paths are
# relative to _static/. Sphinx's own default is MathJax 4 from a CDN; we ship MathJax 3
# because its npm package contains its fonts, while MathJax 4 fetches its default font from a
# CDN at run time. The `window.MathJax = {...}` config that Sphinx writes (mathjax4_config
# under Sphinx 9) is the same for both versions.
mathjax_path = "offline/mathjax/tex-mml-chtml.js"

# The ipywidgets renderer: require.js first, then the html-manager bundle that finds the
# widget state and views myst-nb wrote into the page. myst-nb adds both only to pages that
# have widget state. widgets_offline.js, between the two, shows the renderer where its fonts are
# and maps its one MathJax 2 call (typesetting widget labels) onto MathJax 3.
nb_ipywidgets_js = {
    "offline/require.js": {},
    "widgets_offline.js": {},
    "offline/html-manager/embed-amd.js": {},
}
