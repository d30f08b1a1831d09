// Loaded on pages with widgets, after require.js and before the ipywidgets renderer
// (html-manager's embed-amd.js). Two fixes for reading the site offline:
// 1. The renderer finds its font files (Font Awesome, for widget icons) next to its own module,
//    whose URL require.js derives from the module id: relative to the page, where they are not.
//    Point that id at the folder where build.py copies the renderer.
// 2. The renderer typesets the math in widget labels with the MathJax 2 API,
//    MathJax.Hub.Queue(["Typeset", MathJax.Hub, element]); this site ships MathJax 3, which has
//    no Hub, so each labelled widget logged an error and kept its math raw. Give the renderer
//    that one call: each element is typeset by MathJax 3 once MathJax has started.
(function () {
  "use strict";
  const siteRoot = document.documentElement.dataset.content_root || "";  // written by Sphinx
  window.require.config({
    paths: { "@jupyter-widgets/html-manager/dist": siteRoot + "_static/offline/html-manager" },
  });

  const hub = {
    Queue(...jobs) {
      for (const job of jobs) {
        const element = Array.isArray(job) ? job[2] : undefined;
        if (element) whenStarted(() => window.MathJax.typesetPromise([element]));
      }
    },
  };

  function whenStarted(typeset) {
    const startup = window.MathJax && window.MathJax.startup;
    if (startup) startup.promise.then(typeset);
    else if (document.readyState === "loading") {
      document.addEventListener("DOMContentLoaded", () => whenStarted(typeset), { once: true });
    }
  }

  // Pages without math load no MathJax, and the renderer then skips typesetting: add nothing.
  // MathJax 3 replaces the configuration object window.MathJax with its own when its deferred
  // script runs, so the Hub goes on both: now, and again once the deferred scripts have run.
  function install() {
    if (window.MathJax && !window.MathJax.Hub) window.MathJax.Hub = hub;
  }
  install();
  document.addEventListener("DOMContentLoaded", install, { once: true });
})();
