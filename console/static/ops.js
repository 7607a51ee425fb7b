// The Operations page, live: the page is complete without this script (server-rendered tables);
// with it, the charts are drawn with uPlot from overview.json, and every few seconds the charts
// are fed new data and each table's section is replaced by the server's fresh rendering of it,
// in place (fixed chart heights: nothing jumps).
(function () {
  "use strict";
  var main = document.getElementById("ops");
  if (!main || !window.uPlot || !window.fetch || !window.DOMParser) { return; }
  var every = 3000, height = 220;
  var colors = ["#2151c5", "#1a7f37", "#cf222e", "#9a6700", "#8250df", "#0a7ea4", "#bc4c00", "#57606a"];
  var charts = {};

  // draw puts series (keys, aligned with x) on the chart in the element id, building it anew
  // only when the set of series changes.
  function draw(id, keys, x, ys, unit) {
    var el = document.getElementById(id);
    if (!el) { return; }
    if (keys.length === 0) { keys = ["none"]; ys = [x.map(function () { return 0; })]; }
    var data = [x].concat(ys), sig = keys.join("|"), c = charts[id];
    if (c && c.sig !== sig) { c.plot.destroy(); c = null; }
    if (!c) {
      var series = [{}].concat(keys.map(function (k, i) {
        return { label: k, stroke: colors[i % colors.length], width: 2, points: { show: true, size: 4 } };
      }));
      var opts = { title: el.getAttribute("aria-label"), width: el.clientWidth || 600, height: height,
        series: series, axes: [{}, { label: unit, size: 60 }], scales: { x: { time: true } } };
      c = charts[id] = { sig: sig, el: el, plot: new window.uPlot(opts, data, el) };
    } else {
      c.plot.setData(data);
    }
    var n = 0;
    ys.forEach(function (s) { s.forEach(function (v) { if (v) { n++; } }); });
    el.setAttribute("data-points", String(n));
  }

  function grouped(prefix, m) {
    return Object.keys(m || {}).sort().map(function (k) { return { key: prefix + k, ys: m[k] }; });
  }

  function charted(s) {
    var x = s.minutes;
    var st = grouped("", s.settlements.byState);
    draw("chart-settlements", st.map(function (g) { return g.key; }), x, st.map(function (g) { return g.ys; }), "per minute");
    var an = grouped("verify ", s.answers.verify).concat(grouped("settle ", s.answers.settle));
    draw("chart-answers", an.map(function (g) { return g.key; }), x, an.map(function (g) { return g.ys; }), "per minute");
    var keys = [], ys = [];
    [["verify", s.latency.verify], ["settle", s.latency.settle]].forEach(function (e) {
      if (!e[1].hour.count) { return; }
      ["p50Ms", "p90Ms", "p99Ms"].forEach(function (p) { keys.push(e[0] + " " + p.slice(0, 3)); ys.push(e[1][p]); });
    });
    draw("chart-latency", keys, x, ys, "ms");
  }

  // swap replaces each section whose rendering changed with the server's new one.
  function swap(html) {
    var doc = new DOMParser().parseFromString(html, "text/html");
    main.querySelectorAll("[data-section]").forEach(function (sec) {
      var fresh = doc.getElementById(sec.id);
      if (fresh && fresh.innerHTML !== sec.innerHTML) { sec.innerHTML = fresh.innerHTML; }
    });
    var g = doc.getElementById("generated");
    if (g) { document.getElementById("generated").textContent = g.textContent; }
  }

  var live = document.getElementById("live");
  function poll() {
    var opts = { credentials: "same-origin", cache: "no-store" };
    Promise.all([
      fetch(main.getAttribute("data-overview"), opts).then(function (r) { if (!r.ok) { throw new Error(r.status); } return r.json(); }),
      fetch(window.location.pathname, opts).then(function (r) { if (!r.ok) { throw new Error(r.status); } return r.text(); })
    ]).then(function (got) {
      charted(got[0]);
      swap(got[1]);
      live.classList.add("on");
    }).catch(function () {
      live.classList.remove("on"); // the tables keep their last rendering; the next poll tries again
    }).then(function () { window.setTimeout(poll, every); });
  }
  window.addEventListener("resize", function () {
    Object.keys(charts).forEach(function (id) { var c = charts[id]; c.plot.setSize({ width: c.el.clientWidth, height: height }); });
  });
  poll();
}());
