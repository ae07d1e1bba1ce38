// The site opened from disk (file://, as site/index.html): the browser refuses to start
// a Web Worker there, and the theme's search runs in one. This runs the worker's script
// in a hidden iframe of the page instead, with a worker's postMessage / "message" pair;
// the search index comes from search/search_index.js (written by mkdocs_hooks.py),
// which a page opened from disk may load where it may not fetch search_index.json.
// Served over http(s) (make docs-serve) nothing here runs.
(function () {
  "use strict";
  if (location.protocol !== "file:") return;

  class WorkerFromDisk extends EventTarget {
    constructor(url) {
      super();
      this.pending = []; // messages posted before the worker's script has run
      this.frame = document.createElement("iframe");
      this.frame.hidden = true;
      this.frame.title = "search";
      document.body.appendChild(this.frame);
      const scope = this.frame.contentWindow;
      // what the worker posts arrives here, later, as it would from a worker
      scope.postMessage = (data) =>
        setTimeout(() => this.dispatchEvent(new MessageEvent("message", { data })));
      scope.importScripts = () => {
        throw new Error("importScripts is not available to the search opened from disk");
      };
      const script = scope.document.createElement("script");
      script.src = new URL(url, location.href).href;
      script.onload = () => {
        const pending = this.pending;
        this.pending = null;
        pending.forEach((data) => this.deliver(data));
      };
      script.onerror = () => this.dispatchEvent(new Event("error"));
      scope.document.head.appendChild(script);
    }

    deliver(data) {
      const scope = this.frame.contentWindow;
      scope.dispatchEvent(new scope.MessageEvent("message", { data }));
    }

    postMessage(data) {
      if (this.pending === null) this.deliver(data);
      else this.pending.push(data);
    }

    terminate() {
      this.frame.remove();
    }
  }

  window.Worker = WorkerFromDisk;
})();
