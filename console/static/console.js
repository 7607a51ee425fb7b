// Live answers: the page is complete without this script; with it, the numbers that move
// (state, confirmations, finality) are replaced in place as the server's event stream sends them.
(function () {
  "use strict";
  var main = document.getElementById("answer");
  if (!main || !window.EventSource) { return; }
  var fields = ["transaction", "block", "confirmations", "finality", "head", "advice"];
  var es = new EventSource(main.getAttribute("data-events"));
  es.addEventListener("open", function () { document.getElementById("live").classList.add("on"); });
  es.addEventListener("status", function (e) {
    var l = JSON.parse(e.data);
    document.getElementById("state").textContent = l.stateText;
    document.getElementById("final").textContent = l.finalText;
    fields.forEach(function (f) { document.getElementById(f).textContent = l[f]; });
    var card = main.querySelector(".state");
    card.className = card.className.replace(/state-[a-z_]+/, "state-" + l.state);
    if (l.final) { es.close(); document.getElementById("live").classList.remove("on"); }
  });
}());
