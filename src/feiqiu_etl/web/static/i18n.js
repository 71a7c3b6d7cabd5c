/* The page's language for our JavaScript: window._(english, {name: value}) gives the text in the page's language
   from the JSON catalog the server put into <script id="i18n"> (feiqiu_etl.web.i18n.js_catalog), and fills
   %(name)s placeholders. English is the message id itself. Our own code, no library. */
(function () {
  "use strict";
  var catalog = {};
  try { catalog = JSON.parse(document.getElementById("i18n").textContent) || {}; } catch (e) { catalog = {}; }
  window._ = function (message, args) {
    var text = Object.prototype.hasOwnProperty.call(catalog, message) && catalog[message] ? catalog[message] : message;
    if (args) text = text.replace(/%\((\w+)\)s/g, function (m, k) { return args[k] === undefined ? m : String(args[k]); });
    return text;
  };
  window.FeiqiuI18n = { lang: document.documentElement.lang || "en", catalog: catalog };
})();
