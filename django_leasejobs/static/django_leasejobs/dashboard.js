// Refresh the dashboard body in place every few seconds (no full-page reload, no flash).
(function () {
  "use strict";
  var root = document.getElementById("leasejobs-dashboard");
  if (!root) { return; }
  var url = root.getAttribute("data-refresh-url");
  var every = parseFloat(root.getAttribute("data-refresh-seconds")) || 5;
  var busy = false;
  function refresh() {
    if (busy || document.hidden) { return; }
    busy = true;
    fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "XMLHttpRequest" } })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (html !== null) {
          // The server renders and escapes the fragment; it is this admin's own HTML.
          var next = document.createElement("div");
          next.innerHTML = html;
          root.replaceChildren.apply(root, Array.prototype.slice.call(next.childNodes));
          root.setAttribute("data-refreshed", String(Date.now()));
        }
      })
      .catch(function () { /* keep the last numbers; try again next time */ })
      .then(function () { busy = false; });
  }
  window.setInterval(refresh, every * 1000);
}());
