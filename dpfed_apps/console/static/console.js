/* dpfed console: live parts and the spec upload. No framework, no build step, served by the
   console itself (no CDN). An element with data-live-src is refreshed from that URL (which
   answers its live part as HTML) every data-live-every milliseconds, until the part it holds
   says data-final="true". */
(function () {
  "use strict";

  function setStatus(text) {
    var status = document.getElementById("live-status");
    if (status) { status.textContent = text; }
  }

  function live(el) {
    var src = el.getAttribute("data-live-src");
    var every = parseInt(el.getAttribute("data-live-every"), 10) || 2000;
    var failures = 0;

    function done() {
      return el.querySelector('[data-final="true"]') !== null;
    }

    function tick() {
      if (done()) { setStatus(""); return; }
      fetch(src, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (response) {
          return response.text().then(function (html) {
            if (!response.ok) {
              var error = new Error("HTTP " + response.status);
              error.html = html;
              throw error;
            }
            return html;
          });
        })
        .then(function (html) {
          failures = 0;
          el.innerHTML = html;
          el.removeAttribute("data-stale");
          setStatus("");
          if (!done()) { setTimeout(tick, every); }
        })
        .catch(function (error) {
          failures += 1;
          el.setAttribute("data-stale", "true");
          var message = "Live updates paused";
          if (error && error.html) {
            var holder = document.createElement("div");
            holder.innerHTML = error.html;
            var text = holder.querySelector(".error-message");
            if (text) { message += ": " + text.textContent; }
          }
          setStatus(message + " Retrying.");
          setTimeout(tick, Math.min(every * (1 + failures), 15000));
        });
    }

    setTimeout(tick, every);
  }

  function specUpload() {
    var file = document.getElementById("spec-file");
    var text = document.getElementById("spec-text");
    if (!file || !text || !window.FileReader) { return; }
    file.addEventListener("change", function () {
      if (!file.files || !file.files[0]) { return; }
      var reader = new FileReader();
      reader.onload = function () { text.value = reader.result; };
      reader.readAsText(file.files[0]);
    });
  }

  function start() {
    var parts = document.querySelectorAll("[data-live-src]");
    for (var i = 0; i < parts.length; i++) { live(parts[i]); }
    specUpload();
    var confirm = document.getElementById("confirm-form");
    if (confirm) {
      confirm.addEventListener("submit", function () {
        var button = document.getElementById("confirm-button");
        if (button) { button.disabled = true; button.textContent = "Starting..."; }
      });
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
