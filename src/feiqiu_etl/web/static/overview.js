/* The overview grid: a cell's tooltip (store · task · age · owed details) is made when the pointer reaches it,
   from its row's store and its column's task, so that the page carries 1,050 cells and not 1,050 tooltips.
   Every text is set with textContent/title, never as HTML. Our own code, no library. */
(function () {
  "use strict";
  var grid = document.getElementById("overview");
  if (!grid) return;
  var heads = Array.prototype.map.call(grid.querySelectorAll("thead th.t"), function (th) {
    return th.textContent.trim() + " (" + th.getAttribute("data-code") + ")";
  });
  var first = grid.querySelectorAll("thead th").length - heads.length;
  var owedLabel = grid.getAttribute("data-owed-label") || "{n}";
  function age(s) {
    if (s === "") return _("never loaded");
    s = Number(s);
    if (s < 3600) return _("%(m)s min", { m: Math.floor(s / 60) });
    if (s < 86400) return _("%(h)s h %(m)s min", { h: Math.floor(s / 3600), m: Math.floor(s % 3600 / 60) });
    return _("%(d)s d %(h)s h", { d: Math.floor(s / 86400), h: Math.floor(s % 86400 / 3600) });
  }
  grid.addEventListener("mouseover", function (ev) {
    var td = ev.target.closest ? ev.target.closest("td.cell") : null;
    if (!td || td.title || td.classList.contains("c-none")) return;
    var row = td.parentNode;
    var store = row.querySelector("th.st").textContent.replace(/\s+/g, " ").trim();
    var text = store + " · " + heads[td.cellIndex - first] + " · " + age(td.getAttribute("data-age"));
    var owed = td.getAttribute("data-owed");
    if (owed) text += " · " + owedLabel.replace("{n}", owed);
    td.title = text;
  });
})();
