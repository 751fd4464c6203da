// streamq web: live updates over Server-Sent Events. The server renders every piece
// (escaped there); this script only puts the pieces in place.
"use strict";
(function () {
  function showError(text) {
    var box = document.getElementById("live-error");
    if (!box) return;
    box.textContent = text || "";
    box.hidden = !text;
  }
  function follow(el) {
    var source = new EventSource(el.getAttribute("data-sse"));
    source.addEventListener("update", function (ev) {
      showError("");
      var data = JSON.parse(ev.data);
      Object.keys(data.targets).forEach(function (id) {
        var target = document.getElementById(id);
        if (target) target.innerHTML = data.targets[id];
      });
      document.body.setAttribute("data-updated", String(Date.now()));
    });
    source.addEventListener("append", function (ev) {
      showError("");
      var data = JSON.parse(ev.data);
      if (!data.count) return;
      var target = document.getElementById(data.target);
      if (target) target.insertAdjacentHTML("afterbegin", data.html);
      document.body.setAttribute("data-updated", String(Date.now()));
    });
    source.addEventListener("unavailable", function (ev) {
      showError(JSON.parse(ev.data).message);
    });
    source.addEventListener("end", function () { source.close(); });
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-sse]").forEach(follow);
  });
})();
