"use strict";
(function () {
  var POLL_MS = 1000;
  var FETCH_TIMEOUT_MS = 5000;
  var SVG_NS = "http://www.w3.org/2000/svg";

  function $(id) { return document.getElementById(id); }

  // Every piece of data goes in through textContent, never innerHTML.
  function setText(id, v) { $(id).textContent = v; }

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function svgEl(tag, attrs, text) {
    var e = document.createElementNS(SVG_NS, tag);
    for (var k in attrs) e.setAttribute(k, String(attrs[k]));
    if (text !== undefined) e.textContent = String(text);
    return e;
  }

  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

  // int64 fields arrive as strings; missing fields as undefined.
  function num(v) { var n = Number(v); return isFinite(n) ? n : 0; }

  function pad2(n) { return n < 10 ? "0" + n : String(n); }
  function clock(d) { return pad2(d.getHours()) + ":" + pad2(d.getMinutes()) + ":" + pad2(d.getSeconds()); }

  function fmtBytes(b) {
    b = num(b);
    if (b <= 0) return "–";
    var units = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
    while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
    return (i === 0 ? b.toFixed(0) : b.toFixed(1)) + " " + units[i];
  }

  function fmtLoss(x) {
    x = num(x);
    var a = Math.abs(x);
    if (a !== 0 && (a < 1e-3 || a >= 1e5)) return x.toExponential(3);
    return x.toFixed(4);
  }

  function fmtRate(x) {
    x = num(x);
    return x >= 100 ? Math.round(x).toLocaleString("en-US") : x.toFixed(1);
  }

  function stateClass(s) { return "badge s-" + String(s || "UNSPECIFIED").replace(/[^A-Z_]/g, ""); }

  function renderHeader(st) {
    setText("updated", clock(new Date()));
    var t = num(st.heartbeat_timeout_ms);
    setText("hb-timeout", t > 0 ? (t / 1000).toFixed(1) + " s" : "–");
  }

  function renderFleet(st) {
    var tbody = $("fleet").tBodies[0];
    clear(tbody);
    var workers = st.workers || [];
    var timeoutS = num(st.heartbeat_timeout_ms) / 1000;
    if (workers.length === 0) {
      var tr = el("tr", "empty");
      var td = el("td", null, "no workers registered");
      td.colSpan = 8;
      tr.appendChild(td);
      tbody.appendChild(tr);
      return;
    }
    workers.forEach(function (w) {
      var tr = el("tr", "worker");
      tr.appendChild(el("td", "name", w.name || ""));
      tr.appendChild(el("td", "num rank", num(w.rank)));
      var sc = el("td", "state");
      sc.appendChild(el("span", stateClass(w.state), w.state || "UNSPECIFIED"));
      tr.appendChild(sc);
      var age = num(w.heartbeat_age_s);
      var ac = el("td", "num age", age.toFixed(1));
      if (w.state === "DEAD" || (timeoutS > 0 && age > timeoutS)) ac.className += " stale";
      tr.appendChild(ac);
      tr.appendChild(el("td", "mono address", w.address || ""));
      tr.appendChild(el("td", "num cores", num(w.cpu_cores) > 0 ? num(w.cpu_cores) : "–"));
      tr.appendChild(el("td", "num memory", fmtBytes(w.memory_bytes)));
      tr.appendChild(el("td", "mono held", w.held_by || "–"));
      tbody.appendChild(tr);
    });
  }

  function ended(j) {
    return ["JOB_FINISHED", "JOB_STOPPED", "JOB_FAILED", "JOB_UNREADABLE"].includes(j.state);  // common/job_state.h
  }

  // The job the Job and Mesh panels and the loss curve show.
  function focusJob(st) {
    var jobs = st.jobs || [];
    for (var i = jobs.length - 1; i >= 0; i--) if (!ended(jobs[i])) return jobs[i];
    return jobs.length ? jobs[jobs.length - 1] : null;
  }

  function renderJobs(st) {
    var tbody = $("jobs").tBodies[0];
    clear(tbody);
    var jobs = (st.jobs || []).slice().reverse();  // newest first
    if (jobs.length === 0) {
      var tr0 = el("tr", "empty");
      var td0 = el("td", null, "no jobs");
      td0.colSpan = 8;
      tr0.appendChild(td0);
      tbody.appendChild(tr0);
      return;
    }
    jobs.slice(0, 50).forEach(function (j) {
      var tr = el("tr", "job");
      tr.appendChild(el("td", "mono", j.job_id || ""));
      tr.appendChild(el("td", null, j.name || ""));
      var sc = el("td");
      sc.appendChild(el("span", stateClass(j.state), j.state || "UNSPECIFIED"));
      tr.appendChild(sc);
      tr.appendChild(el("td", "num", num(j.step) + " / " + num(j.steps)));
      tr.appendChild(el("td", null, j.detached ? "detached" : "attached"));
      tr.appendChild(el("td", "mono", j.mesh_id || "–"));
      tr.appendChild(el("td", "mono", (j.workers || []).join(", ") || "–"));
      var note = j.error || j.waiting_for || j.checkpoint_error || "";
      tr.appendChild(el("td", j.error ? "err" : null, note || "–"));
      tbody.appendChild(tr);
    });
  }

  function renderMesh(st) {
    var meshes = st.meshes || [];
    setText("mesh-count", String(meshes.length));
    var j = focusJob(st);
    var m = null;
    meshes.forEach(function (x) { if (j && x.mesh_id === j.mesh_id) m = x; });
    if (!m && meshes.length) m = meshes[meshes.length - 1];
    var ranks = $("mesh-ranks");
    clear(ranks);
    if (!m || !m.mesh_id) {
      setText("mesh-id", "no mesh"); setText("mesh-epoch", "–"); setText("mesh-axes", "–"); setText("mesh-job", "–");
      return;
    }
    setText("mesh-job", m.job_id || "idle");
    setText("mesh-id", m.mesh_id);
    setText("mesh-epoch", num(m.epoch));
    var axes = (m.axes || []).map(function (a) { return (a.name || "?") + "=" + num(a.size); });
    setText("mesh-axes", axes.length ? axes.join(",") : "–");
    (m.worker_names || []).forEach(function (name, r) {
      var li = el("li");
      li.appendChild(el("span", "r", r));
      li.appendChild(document.createTextNode(name));
      ranks.appendChild(li);
    });
  }

  function renderJob(st) {
    var j = focusJob(st);
    var prog = $("job-progress");
    if (!j || !j.job_id) {
      setText("job-id", "no job"); setText("job-name", "–");
      var s0 = $("job-state"); s0.className = "badge"; s0.textContent = "–";
      setText("job-step", "0"); setText("job-steps", "0"); setText("job-start", "");
      prog.max = 1; prog.value = 0; setText("job-pct", "0%");
      ["job-loss", "job-tps", "job-ms", "job-error", "job-stragglers"].forEach(function (id) { setText(id, "–"); });
      $("job-error").className = "";
      return;
    }
    setText("job-id", j.job_id);
    setText("job-name", j.name || "–");
    var s = $("job-state");
    s.className = stateClass(j.state);
    s.textContent = j.state || "UNSPECIFIED";
    var step = num(j.step), steps = num(j.steps);
    setText("job-step", String(step));
    setText("job-steps", String(steps));
    setText("job-start", num(j.start_step) > 0 ? "(resumed from step " + num(j.start_step) + ")" : "");
    var frac = steps > 0 ? Math.min(1, Math.max(0, step / steps)) : 0;
    prog.max = 1; prog.value = frac;
    setText("job-pct", Math.floor(frac * 100) + "%");
    var last = j.last || {};
    setText("job-loss", last.has_loss ? fmtLoss(last.loss) : "–");
    setText("job-tps", num(last.tokens_per_s) > 0 ? fmtRate(last.tokens_per_s) : "–");
    setText("job-ms", num(last.step_ms) > 0 ? num(last.step_ms).toFixed(1) + " ms" : "–");
    setText("job-error", j.error ? j.error : "–");
    // Ranks named slow (StragglerPolicy), the newest last.
    var slow = (j.stragglers || []).map(function (x) {
      return (x.worker || "?") + " (rank " + num(x.rank) + ") " + num(x.factor).toFixed(2) + "x at step " +
        num(x.step) + (x.evicted ? ", moved off" : "");
    });
    setText("job-stragglers", slow.length ? slow.join("; ") : "none");
    $("job-error").className = j.error ? "err" : "";
  }

  // One bar per rank: its newest step split into its own compute, exposed
  // communication and pipeline idle (JobStatus.rank_times), with the figures
  // written beside it.
  function renderRanks(st) {
    var j = focusJob(st);
    var svg = $("rank-chart");
    clear(svg);
    var times = (j && j.rank_times) || [];
    setText("ranks-step", times.length ? "step " + num(times[0].step) : "–");
    var link = $("trace-link");
    link.textContent = st.newest_trace_job ? "trace.json (job " + st.newest_trace_job + ")" : "none yet (baton trace JOB)";
    if (!times.length) {
      svg.appendChild(svgEl("text", { x: 300, y: 100, "text-anchor": "middle", "class": "axis" }, "no steps yet"));
      return;
    }
    var W = 600, L = 90, R = 10, rowH = Math.min(40, 190 / times.length);
    var most = 0;
    times.forEach(function (t) { most = Math.max(most, num(t.compute_ms) + num(t.exposed_comm_ms) + num(t.idle_ms)); });
    var scale = most > 0 ? (W - L - R - 150) / most : 0;
    times.forEach(function (t, i) {
      var y = 5 + i * rowH, x = L;
      var g = svgEl("g", { "class": "rank-bar", "data-rank": num(t.rank), "data-worker": t.worker || "",
                            "data-compute-ms": num(t.compute_ms), "data-exposed-comm-ms": num(t.exposed_comm_ms),
                            "data-idle-ms": num(t.idle_ms) });
      g.appendChild(svgEl("text", { x: 4, y: y + rowH * 0.6, "class": "axis" }, "rank " + num(t.rank)));
      [["compute", t.compute_ms], ["comm", t.exposed_comm_ms], ["idle", t.idle_ms]].forEach(function (part) {
        var w = num(part[1]) * scale;
        g.appendChild(svgEl("rect", { x: x.toFixed(1), y: y.toFixed(1), width: w.toFixed(1),
                                      height: (rowH * 0.8).toFixed(1), "class": "bar " + part[0] }));
        x += w;
      });
      g.appendChild(svgEl("text", { x: (x + 6).toFixed(1), y: y + rowH * 0.6, "class": "figure" },
                          num(t.compute_ms).toFixed(2) + " / " + num(t.exposed_comm_ms).toFixed(2) + " / " +
                          num(t.idle_ms).toFixed(2) + " ms"));
      svg.appendChild(g);
    });
  }

  function renderLoss(st) {
    var svg = $("loss-curve");
    clear(svg);
    var W = 600, H = 240, L = 64, R = 16, T = 14, B = 30;
    var j = focusJob(st), steps = [];
    (st.histories || []).forEach(function (h) { if (j && h.job_id === j.job_id) steps = h.steps || []; });
    var pts = steps.filter(function (m) { return m && m.has_loss && isFinite(Number(m.loss)); })
      .map(function (m) { return [num(m.step), Number(m.loss)]; });
    svg.appendChild(svgEl("rect", { "class": "frame", x: L, y: T, width: W - L - R, height: H - T - B }));
    if (pts.length === 0) {
      svg.appendChild(svgEl("text", { "class": "empty", x: W / 2, y: H / 2, "text-anchor": "middle" }, "no loss yet"));
      return;
    }
    var s0 = pts[0][0], s1 = pts[pts.length - 1][0];
    var lo = Infinity, hi = -Infinity;
    pts.forEach(function (p) { lo = Math.min(lo, p[1]); hi = Math.max(hi, p[1]); });
    var span = hi - lo, pad = span > 0 ? span * 0.05 : Math.max(Math.abs(hi) * 0.05, 0.5);
    var y0 = lo - pad, y1 = hi + pad;
    var xs = s1 > s0 ? s1 - s0 : 1;
    function X(s) { return L + (s1 > s0 ? (s - s0) / xs : 0.5) * (W - L - R); }
    function Y(v) { return T + (1 - (v - y0) / (y1 - y0)) * (H - T - B); }
    [0.25, 0.5, 0.75].forEach(function (f) {
      var y = T + f * (H - T - B);
      svg.appendChild(svgEl("line", { "class": "grid", x1: L, x2: W - R, y1: y, y2: y }));
    });
    if (pts.length === 1) {
      svg.appendChild(svgEl("circle", { "class": "dot", cx: X(pts[0][0]), cy: Y(pts[0][1]), r: 3 }));
    } else {
      var d = pts.map(function (p) { return X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1); }).join(" ");
      svg.appendChild(svgEl("polyline", { "class": "curve", points: d }));
    }
    // Axis labels: max and min loss on the left, the step range below.
    svg.appendChild(svgEl("text", { x: L - 6, y: Y(hi) + 4, "text-anchor": "end" }, fmtLoss(hi)));
    svg.appendChild(svgEl("text", { x: L - 6, y: Y(lo) + 4, "text-anchor": "end" }, fmtLoss(lo)));
    svg.appendChild(svgEl("text", { x: L, y: H - 10, "text-anchor": "start" }, "step " + s0));
    svg.appendChild(svgEl("text", { x: W - R, y: H - 10, "text-anchor": "end" }, "step " + s1));
    svg.appendChild(svgEl("text", { x: (L + W - R) / 2, y: H - 10, "text-anchor": "middle" },
      pts.length + " points, last " + fmtLoss(pts[pts.length - 1][1])));
  }

  function renderEvents(st) {
    var ul = $("events");
    clear(ul);
    var evs = (st.events || []).slice().reverse();  // newest first
    if (evs.length === 0) { ul.appendChild(el("li", "none", "no events")); return; }
    evs.forEach(function (e) {
      var li = el("li", "event");
      var ms = num(e.time_unix_ms);
      li.appendChild(el("span", "t", ms > 0 ? clock(new Date(ms)) : "–"));
      li.appendChild(el("span", "k", e.kind || ""));
      li.appendChild(el("span", "w", e.worker || e.job_id || ""));
      var parts = [];
      if (e.job_id && e.worker) parts.push(e.job_id);
      if (e.mesh_id) parts.push(e.mesh_id);
      if (num(e.step) > 0) parts.push("step " + num(e.step));
      if (e.detail) parts.push(e.detail);
      if (e.cause) parts.push("(" + e.cause + ")");
      li.appendChild(el("span", "m", parts.join(" ")));
      if (ms > 0) li.title = new Date(ms).toISOString();
      ul.appendChild(li);
    });
  }

  function render(st) {
    // Each part is drawn on its own, so one odd field cannot blank the page.
    [renderHeader, renderFleet, renderJobs, renderMesh, renderJob, renderRanks, renderLoss, renderEvents].forEach(function (f) {
      try { f(st); } catch (err) { if (window.console) console.error(err); }
    });
  }

  function setReachable(ok) {
    var c = $("conn");
    c.className = ok ? "ok" : "down";
    c.textContent = ok ? "live" : "controller unreachable";
    $("banner").className = ok ? "" : "show";
  }

  function fetchStatus() {
    var ctl = typeof AbortController === "function" ? new AbortController() : null;
    var timer = ctl ? setTimeout(function () { ctl.abort(); }, FETCH_TIMEOUT_MS) : null;
    return fetch("api/status", { cache: "no-store", credentials: "same-origin",
                                 headers: { "Accept": "application/json" },
                                 signal: ctl ? ctl.signal : undefined })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .finally(function () { if (timer) clearTimeout(timer); });
  }

  function poll() {
    var started = Date.now();
    fetchStatus().then(function (st) {
      setReachable(true);
      render(st || {});
    }, function () {
      setReachable(false);  // keep the last figures on screen and keep polling
    }).then(function () {
      setTimeout(poll, Math.max(0, POLL_MS - (Date.now() - started)));
    });
  }

  renderLoss({});  // the empty frame until the first answer
  poll();
})();
