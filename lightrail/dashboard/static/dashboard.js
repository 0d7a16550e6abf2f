// lightrail dashboard: live updates without a reload. Every few seconds, while the tab is visible and the
// "Live updates" box is ticked, fetch this page again and swap in the parts marked data-live (same ids), keeping
// the <details> the reader opened. No framework, no build.
(function () {
  "use strict";
  var PERIOD_MS = parseInt(document.body.getAttribute("data-live-period"), 10) || 3000;
  var toggle = document.getElementById("live-toggle");
  var status = document.getElementById("live-status");
  var busy = false;

  // <details> the reader opened, by their data-key (a span id, a call number), so a part that gained rows above
  // them reopens the same ones
  function openKeys(root) {
    var open = [];
    root.querySelectorAll("details[data-key]").forEach(function (d) {
      if (d.open) open.push(d.getAttribute("data-key"));
    });
    return open;
  }

  function refresh() {
    if (busy || !toggle || !toggle.checked || document.hidden) return;
    var parts = document.querySelectorAll("[data-live]");
    if (!parts.length) return;
    busy = true;
    fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (response) {
        if (response.redirected || !response.ok) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html");
        parts.forEach(function (part) {
          var next = fresh.getElementById(part.id);
          if (!next || next.innerHTML === part.innerHTML) return;
          var open = openKeys(part);
          part.innerHTML = next.innerHTML;
          part.querySelectorAll("details[data-key]").forEach(function (d) {
            if (open.indexOf(d.getAttribute("data-key")) >= 0) d.open = true;
          });
        });
        if (status) status.textContent = "updated " + new Date().toLocaleTimeString();
      })
      .catch(function (err) { if (status) status.textContent = "update failed: " + err.message; })
      .finally(function () { busy = false; });
  }

  if (toggle) {
    toggle.addEventListener("change", function () {
      var url = new URL(window.location.href);
      if (toggle.checked) url.searchParams.delete("live"); else url.searchParams.set("live", "0");
      window.history.replaceState(null, "", url);
      if (status) status.textContent = toggle.checked ? "live" : "paused";
    });
  }
  window.setInterval(refresh, PERIOD_MS);
})();
