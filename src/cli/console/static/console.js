// icq console: live refresh of the overview. The server renders (and escapes) every
// figure; this only swaps the fragment at /live in place every few seconds.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live) return;
  var url = live.getAttribute("data-refresh");
  var every = parseInt(live.getAttribute("data-every"), 10) || 5000;
  function refresh() {
    fetch(url, { headers: { Accept: "text/html" }, credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (html !== null) {
          live.innerHTML = html;
          live.setAttribute("data-refreshed", String(Date.now()));
        }
      })
      .catch(function () { /* the console is gone or restarting: try again next tick */ })
      .then(function () { setTimeout(refresh, every); });
  }
  setTimeout(refresh, every);
})();
