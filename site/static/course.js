// The course site's own behaviour, on every page (loaded from conf.py's html_js_files):
// 1. Figures open full size on a click, a tap or Enter: the column shows them shrunk, and a phone
//    far smaller still.
// 2. Search over file:// lists the matching pages without fetching them for text snippets: a page
//    opened from a file may not fetch another, and each attempt logged an uncaught error. The
//    search page says how to get the snippets back (serve the folder over http).
// 3. Sliders cannot redraw anything on a static page, which has no Python kernel behind it: they are
//    shown disabled, under a note that says to run the notebook in Jupyter.
(function () {
  "use strict";
  const offline = window.location.protocol === "file:";
  // Sphinx declares DOCUMENTATION_OPTIONS with const: a global, but not a property of window.
  if (offline && typeof DOCUMENTATION_OPTIONS !== "undefined") DOCUMENTATION_OPTIONS.SHOW_SEARCH_SUMMARY = false;

  // Called again whenever the page changes: the widget renderer draws its figures after load.
  function linkFiguresToFullSize() {
    for (const image of document.querySelectorAll(".cell_output img")) {
      if (image.closest("a")) continue;
      const link = document.createElement("a");
      link.href = image.getAttribute("src");
      link.className = "figure-full-size";
      link.title = "Open the figure full size";
      image.replaceWith(link);
      link.appendChild(image);
    }
  }

  function explainOfflineSearch() {
    const results = document.getElementById("search-results");
    if (!offline || !results) return;
    const note = document.createElement("p");
    note.className = "course-note";
    note.textContent = "Opened from a file, search lists the matching pages without text snippets. For " +
      "snippets, serve the site: python -m http.server -d _build/html, then open http://127.0.0.1:8000/search.html.";
    results.before(note);
  }

  const SLIDER_MODEL = /SliderModel$/;

  function holdsSlider(modelId, models) {
    const model = models[modelId];
    if (!model) return false;
    if (SLIDER_MODEL.test(model.model_name)) return true;
    const children = model.state.children || [];
    return children.some((child) => holdsSlider(child.replace("IPY_MODEL_", ""), models));
  }

  // Runs before the widget renderer reads the state (it renders on the window's load event).
  function freezeSliders() {
    const stateTag = document.querySelector('script[type="application/vnd.jupyter.widget-state+json"]');
    if (!stateTag) return;
    const saved = JSON.parse(stateTag.textContent);
    const models = saved.state;
    for (const model of Object.values(models)) {
      if (SLIDER_MODEL.test(model.model_name)) model.state.disabled = true;
    }
    stateTag.textContent = JSON.stringify(saved);
    for (const view of document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]')) {
      if (!holdsSlider(JSON.parse(view.textContent).model_id, models)) continue;
      const note = document.createElement("p");
      note.className = "course-note";
      note.textContent = "Run this notebook in Jupyter to move the sliders: this page has no Python behind it, " +
        "so the chart below stays as drawn for the values shown.";
      view.before(note);
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    linkFiguresToFullSize();
    new MutationObserver(linkFiguresToFullSize).observe(document.body, { childList: true, subtree: true });
    explainOfflineSearch();
    freezeSliders();
  });
})();
