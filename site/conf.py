"""Sphinx configuration of the course site. Run it through `python site/build.py`, which
assembles the source tree (notebooks + generated home page) and fetches the JavaScript
libraries that this file points at; see build.py for the why of each vendored file."""

project = "LLM inference, from a naive generate() loop to chunked prefill"
author = "the course authors"
copyright = "the course authors"

extensions = ["myst_nb"]
myst_enable_extensions = ["dollarmath", "amsmath"]  # $a^2$ and $$...$$ in markdown cells

# Render the outputs stored in the notebooks; never run a kernel while building the site.
nb_execution_mode = "off"

html_theme = "sphinx_book_theme"
html_title = "LLM inference"
html_theme_options = {
    "home_page_in_toc": True,
    "show_toc_level": 2,
}
# The theme reads the light/dark mode from localStorage, which is empty on a first visit: without
# a default it logs "Got invalid theme mode" in the console of every new reader.
html_context = {"default_mode": "auto"}
# Our own script (widgets_offline.js); the npm libraries are copied into _static/offline/ by build.py.
html_static_path = ["static"]

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
