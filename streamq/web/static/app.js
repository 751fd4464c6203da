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
      if (!target) return;
      // a job has one completion record: an item already shown is not added again
      var box = document.createElement(target.tagName);
      box.innerHTML = data.html;
      Array.prototype.slice.call(box.children).reverse().forEach(function (item) {
        var job = item.getAttribute("data-job");
        if (job && target.querySelector('[data-job="' + CSS.escape(job) + '"]')) return;
        target.insertBefore(item, target.firstChild);
      });
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
