/* The page script of `scrapy frontier report` (scrapy-reliability). It reads the
 * report's figures from the JSON element and builds the charts (Chart.js) and tables.
 * Every stored value is put in the page as a text node (textContent), never as HTML. */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var STATES = ["pending", "leased", "done", "ignored", "dead"];
  var COLORS = {
    discovered: "#6a1b9a", outstanding: "#1565c0", pending: "#1565c0", leased: "#f9a825",
    done: "#2e7d32", ignored: "#9e9e9e", dead: "#c62828", transient: "#ef6c00",
    throttled: "#8e24aa", permanent: "#c62828", cancelled: "#757575", refused: "#4e342e",
    corrupt: "#00838f", unknown: "#455a64"
  };
  var PALETTE = ["#00695c", "#ad1457", "#283593", "#9e9d24", "#4e342e"];
  var charts = {};
  window.frontierReport = { charts: charts, data: data };

  function color(name, i) { return COLORS[name] || PALETTE[i % PALETTE.length]; }

  function el(tag, text, cls) {
    var node = document.createElement(tag);
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    if (cls) { node.className = cls; }
    return node;
  }

  function pad(n) { return (n < 10 ? "0" : "") + n; }

  function iso(t) {
    if (t === null || t === undefined) { return "-"; }
    var d = new Date(t * 1000);
    return d.getUTCFullYear() + "-" + pad(d.getUTCMonth() + 1) + "-" + pad(d.getUTCDate()) +
      " " + pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + ":" + pad(d.getUTCSeconds()) +
      " UTC";
  }

  function short(t, width) {
    var d = new Date(t * 1000);
    var hm = pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes());
    if (width >= 3600) { return pad(d.getUTCMonth() + 1) + "-" + pad(d.getUTCDate()) + " " + hm; }
    return width >= 60 ? hm : hm + ":" + pad(d.getUTCSeconds());
  }

  function duration(s) {
    if (s < 90) { return Math.round(s) + " s"; }
    if (s < 5400) { return Math.round(s / 60) + " min"; }
    if (s < 129600) { return (s / 3600).toFixed(1) + " h"; }
    return (s / 86400).toFixed(1) + " d";
  }

  function sum(values) { return values.reduce(function (a, b) { return a + b; }, 0); }

  /* A table of rows; columns: [header, function(row) -> value, class]. */
  function table(columns, rows) {
    var t = el("table");
    var head = el("tr");
    columns.forEach(function (c) { head.appendChild(el("th", c[0], c[2] === "num" ? "num" : "")); });
    t.appendChild(el("thead")).appendChild(head);
    var body = t.appendChild(el("tbody"));
    var trs = rows.map(function (row) {
      var tr = el("tr");
      columns.forEach(function (c) {
        var v = c[1](row);
        tr.appendChild(el("td", v === null || v === undefined || v === "" ? "-" : v, c[2] || ""));
      });
      body.appendChild(tr);
      return tr;
    });
    var box = el("div", null, "scroll");
    box.appendChild(t);
    return { node: box, rows: trs };
  }

  function leftOut(part, what, hint) {
    if (!part.left_out) { return null; }
    return el("p", part.left_out + " more " + what + " left out of this report (" +
      part.rows.length + " of " + part.total + " listed" + (hint ? "; " + hint : "") + ").", "note");
  }

  function card(parent, label, value) {
    var c = el("div", null, "card");
    c.appendChild(el("b", value));
    c.appendChild(el("span", label, "meta"));
    parent.appendChild(c);
  }

  /* A chart, or a line saying there is nothing to draw. */
  function chart(id, config, hasData, emptyText) {
    var canvas = document.getElementById(id);
    if (!hasData) {
      var box = canvas.parentNode;
      box.parentNode.replaceChild(el("p", emptyText, "empty"), box);
      return;
    }
    config.options = Object.assign({
      animation: false, responsive: true, maintainAspectRatio: false,
      interaction: { mode: "index", intersect: false },
      plugins: { legend: { position: "bottom" } }
    }, config.options || {});
    charts[id] = new Chart(canvas, config);
  }

  function classSets(byClass, stack) {
    return Object.keys(byClass).sort().map(function (cls, i) {
      return { label: cls, data: byClass[cls], backgroundColor: color(cls, i), stack: stack };
    });
  }

  function hasPoints(datasets) {
    return datasets.some(function (d) { return sum(d.data) > 0; });
  }

  var stacked = { x: { stacked: true }, y: { stacked: true, beginAtZero: true } };

  function summary() {
    var job = data.job;
    document.getElementById("meta").textContent = "Job " + job.name + ", run " + job.generation +
      " (" + job.state + ") in " + data.database + ". Started " + iso(job.created_at) +
      (job.finished_at ? ", finished " + iso(job.finished_at) : "") +
      ". Report generated " + iso(data.generated_at) + ".";
    var body = document.getElementById("summary-body");
    var cards = el("div", null, "cards");
    var total = 0;
    STATES.forEach(function (s) { total += data.counts[s] || 0; card(cards, s, data.counts[s] || 0); });
    card(cards, "requests", total);
    card(cards, "live workers", data.workers.length);
    if (data.expired_leases) { card(cards, "expired leases", data.expired_leases); }
    body.appendChild(cards);
    var classes = Object.keys(data.dead_by_class).sort();
    body.appendChild(el("p", classes.length ? "Dead letters by class: " + classes.map(function (c) {
      return c + " " + data.dead_by_class[c];
    }).join(", ") + "." : "No dead letters.", "meta"));
    if (data.workers.length) {
      body.appendChild(table([
        ["worker", function (w) { return w.id; }], ["host", function (w) { return w.hostname; }],
        ["pid", function (w) { return w.pid; }, "num"],
        ["started", function (w) { return iso(w.started_at); }],
        ["heartbeat", function (w) { return iso(w.heartbeat_at); }],
        ["leases", function (w) { return w.leases; }, "num"]
      ], data.workers).node);
    }
    var actions = data.operator_actions || [];
    if (actions.length) {
      body.appendChild(el("p", "Operator actions (the latest " + actions.length +
        "; scrapy frontier pause, resume, limit, add, stop):", "meta"));
      body.appendChild(table([
        ["when", function (a) { return iso(a.at); }],
        ["who", function (a) { return a.who; }, "text"],
        ["action", function (a) { return a.action; }, "text"],
        ["what", function (a) { return a.detail; }, "text"]
      ], actions).node);
    }
  }

  function timelines() {
    var tl = data.timeline;
    var ends = tl.times.map(function (t) { return short(t + tl.width, tl.width); });
    var starts = tl.times.map(function (t) { return short(t, tl.width); });
    document.getElementById("progress-note").textContent = "Cumulative, at the end of each " +
      duration(tl.width) + " bucket (UTC). Discovered, done, ignored and dead come from the " +
      "rows' times; outstanding (pending or leased) is discovered minus those, so a request " +
      "requeued or retried counts as outstanding from its discovery to its latest end." +
      (tl.outside ? " " + tl.outside + " rows had times outside the range and are not counted." : "");
    var p = tl.progress;
    /* From zero at the start of the first bucket to the end of each. */
    var progress = ["discovered", "outstanding", "done", "dead", "ignored"].map(function (k) {
      return { label: k, data: [0].concat(p[k]), borderColor: color(k), backgroundColor: color(k),
        pointRadius: 0, borderWidth: 2, tension: 0.1 };
    });
    var points = [short(tl.start, tl.width)].concat(ends);
    chart("chart-progress", { type: "line", data: { labels: points, datasets: progress },
      options: { scales: { y: { beginAtZero: true } } } },
      hasPoints(progress), "No requests in this job yet.");
    var outcomes = ["done", "ignored", "dead"].filter(function (s) { return tl.outcomes[s]; })
      .map(function (s) {
        return { label: s, data: tl.outcomes[s], backgroundColor: color(s), stack: "o" };
      });
    chart("chart-outcomes", { type: "bar", data: { labels: starts, datasets: outcomes },
      options: { scales: stacked } }, hasPoints(outcomes), "No request has finished yet.");
    var failures = classSets(tl.failures, "f");
    chart("chart-failures", { type: "bar", data: { labels: starts, datasets: failures },
      options: { scales: stacked } }, hasPoints(failures), "No request has failed.");
    var dead = classSets(tl.dead_letters, "d");
    chart("chart-dead", { type: "bar", data: { labels: starts, datasets: dead },
      options: { scales: stacked } }, hasPoints(dead), "No dead letters.");
  }

  function domains() {
    var part = data.domains;
    var top = part.rows.slice(0, 30);
    var sets = STATES.map(function (s) {
      return { label: s, data: top.map(function (d) { return d.counts[s]; }),
        backgroundColor: color(s), stack: "s" };
    });
    chart("chart-domains", { type: "bar", data: {
      labels: top.map(function (d) { return d.domain; }), datasets: sets },
      options: { indexAxis: "y", scales: { x: { stacked: true, beginAtZero: true },
        y: { stacked: true } } } },
      hasPoints(sets), "No domains yet.");
    var body = document.getElementById("domains-body");
    if (part.rows.length > top.length) {
      body.appendChild(el("p", "The chart shows the " + top.length + " domains with the most " +
        "pending and leased requests; the table lists " + part.rows.length + ".", "note"));
    }
    function count(s) { return function (d) { return d.counts[s]; }; }
    function rate(r) { return r ? (+r.toPrecision(3)) + "/s" : "unlimited"; }
    body.appendChild(table([
      ["domain", function (d) { return d.domain; }, "text"],
      ["pending", count("pending"), "num"], ["leased", count("leased"), "num"],
      ["done", count("done"), "num"], ["dead", count("dead"), "num"],
      ["ignored", count("ignored"), "num"],
      ["paused until", function (d) {
        return d.paused_until ? iso(d.paused_until) + (d.pause_reason ? " (" + d.pause_reason + ")" : "") : "";
      }, "text"],
      ["rate limit", function (d) { return d.rate_limit ? rate(d.rate_limit) + ", burst " + d.burst : "none"; }],
      ["adaptive", function (d) { return d.learned || "configured"; }, "text"],
      ["rate now", function (d) { return rate(d.effective_rate); }, "num"],
      ["Crawl-delay", function (d) { return d.crawl_delay ? d.crawl_delay + " s" : ""; }, "num"],
      ["at once", function (d) { return d.concurrency || "no cap"; }, "num"],
      ["next due", function (d) { return d.next_due === null ? "" : iso(d.next_due); }]
    ], part.rows).node);
    var more = leftOut(part, "domains", "scrapy frontier domains --limit 0 lists all");
    if (more) { body.appendChild(more); }
  }

  function pending() {
    var part = data.oldest_pending;
    var body = document.getElementById("pending-body");
    if (!part.rows.length) { body.appendChild(el("p", "No pending requests.", "empty")); return; }
    body.appendChild(table([
      ["id", function (r) { return r.id; }, "num"],
      ["discovered", function (r) { return iso(r.created_at); }],
      ["waiting", function (r) { return duration(data.generated_at - r.created_at); }, "num"],
      ["not before", function (r) { return r.not_before > data.generated_at ? iso(r.not_before) : "due"; }],
      ["attempts", function (r) { return r.attempts; }, "num"],
      ["domain", function (r) { return r.domain; }, "text"],
      ["url", function (r) { return r.url; }, "url"],
      ["last error", function (r) {
        return r.error_class ? r.error_class + ": " + (r.last_error || "") : r.last_error;
      }, "text"]
    ], part.rows).node);
    var more = leftOut(part, "pending requests", "scrapy frontier explain URL tells why one waits");
    if (more) { body.appendChild(more); }
  }

  function deadLetters() {
    var part = data.dead_letters;
    var body = document.getElementById("dead-body");
    var input = document.getElementById("dead-filter");
    var counter = document.getElementById("dead-count");
    if (!part.rows.length) {
      body.appendChild(el("p", "No dead letters.", "empty"));
      input.disabled = true;
      return;
    }
    var cols = [
      ["id", function (r) { return r.request_id !== null ? r.request_id : "item " + r.id; }, "num"],
      ["class", function (r) { return r.error_class; }],
      ["status", function (r) { return r.last_status; }, "num"],
      ["attempts", function (r) { return r.attempts; }, "num"],
      ["first failure", function (r) { return iso(r.first_failed_at); }],
      ["last failure", function (r) { return iso(r.last_failed_at); }],
      ["domain", function (r) { return r.domain; }, "text"],
      ["url", function (r) { return r.url; }, "url"],
      ["error", function (r) { return r.last_error; }, "text"]
    ];
    var built = table(cols, part.rows);
    var haystacks = part.rows.map(function (r) {
      return cols.map(function (c) { var v = c[1](r); return v === null ? "" : String(v); })
        .join("\u0001").toLowerCase();
    });
    body.appendChild(built.node);
    var more = leftOut(part, "dead letters",
      "the most recent are listed; scrapy frontier dead --output FILE exports all");
    if (more) { body.appendChild(more); }
    function apply() {
      var words = input.value.toLowerCase().split(/\s+/).filter(Boolean);
      var shown = 0;
      built.rows.forEach(function (tr, i) {
        var match = words.every(function (w) { return haystacks[i].indexOf(w) !== -1; });
        tr.classList.toggle("hidden", !match);
        if (match) { shown += 1; }
      });
      counter.textContent = shown + " of " + part.rows.length + " shown" +
        (part.left_out ? " (" + part.left_out + " more not in this report)" : "");
    }
    input.addEventListener("input", apply);
    apply();
  }

  summary();
  timelines();
  domains();
  pending();
  deadLetters();
  document.body.setAttribute("data-ready", "1");
})();
