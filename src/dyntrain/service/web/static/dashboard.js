// dyntrain dashboard: live sections, charts (uPlot), logs that follow, actions. No build step.
"use strict";
(() => {
  const POLL_MS = 2000;
  const LOG_POLL_MS = 1000;
  const body = document.body;
  const page = body.dataset.page;
  const KIND_COLOURS = {
    start: "#2f6fdf", resume: "#2f6fdf", reattach: "#2f6fdf", join: "#1f9d55",
    leave: "#c98a00", crash: "#d64545", hang: "#a52a8a",
  };
  // an environment's colour is its capacity type's (as in the tables' badges) while that is
  // unique, else the next free one of the palette
  const TYPE_COLOURS = { SPOT: "#7b4fd6", RESERVED: "#0f8f8f", ON_DEMAND: "#c2631a" };
  const ENV_COLOURS = ["#2f6fdf", "#d64545", "#1f9d55", "#8a6200", "#a52a8a", "#4a5468"];
  function envColours(envs) {
    const used = new Set();
    const spare = ENV_COLOURS.slice();
    return envs.map((env) => {
      const colour = TYPE_COLOURS[env.capacity_type];
      if (colour && !used.has(colour)) { used.add(colour); return colour; }
      return spare.length ? spare.shift() : "#667085";
    });
  }

  // ------------------------------------------------------------------------- plumbing

  const flashEl = document.getElementById("flash");
  let flashTimer = null;
  function flash(text, isError) {
    if (!flashEl) return;
    flashEl.textContent = text;
    flashEl.className = "flash" + (isError ? " error" : "");
    flashEl.hidden = false;
    clearTimeout(flashTimer);
    flashTimer = setTimeout(() => { flashEl.hidden = true; }, isError ? 8000 : 3500);
  }

  const live = document.getElementById("live");
  function setLive(ok, why) {
    if (!live) return;
    live.className = "live " + (ok ? "ok" : "stale");
    live.title = ok ? "live: updated " + new Date().toLocaleTimeString() : why;
  }

  // A GET that knows about the session: a redirect to the login page or a 401 means it ended.
  async function getJSON(url) {
    const r = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (r.status === 401 || (r.redirected && new URL(r.url).pathname === "/ui/login")) {
      throw new Error("the session ended: log in again");
    }
    if (!r.ok) throw new Error(await detail(r));
    return r.json();
  }

  async function detail(r) {
    try { return (await r.json()).detail || r.statusText; } catch (e) { return `${r.status} ${r.statusText}`; }
  }

  // The native API's actions; the header marks a request sent by this page (see web/auth.py).
  async function act(method, url, payload) {
    const r = await fetch(url, {
      method, credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-Dyntrain-Dashboard": "1" },
      body: payload === undefined ? undefined : JSON.stringify(payload),
    });
    if (!r.ok) throw new Error(await detail(r));
    return r.json();
  }

  // Calls fn every ms milliseconds (not while the tab is hidden), never two at once.
  function every(ms, fn) {
    let timer = null;
    const run = async () => {
      clearTimeout(timer);
      if (!document.hidden) {
        try { await fn(); } catch (e) { setLive(false, e.message); }
      }
      timer = setTimeout(run, ms);
    };
    document.addEventListener("visibilitychange", () => { if (!document.hidden) run(); });
    run();
    return run;
  }

  // ------------------------------------------------------------------------- live sections

  async function refreshParts() {
    const url = body.dataset.parts;
    if (!url) return;
    const parts = await getJSON(url);
    for (const [name, html] of Object.entries(parts)) {
      const el = document.querySelector(`[data-part="${name}"]`);
      if (!el || el.dataset.html === html) continue;
      const focused = document.activeElement;
      if (focused && focused !== body && el.contains(focused)) continue; // someone is typing there
      el.innerHTML = html;
      el.dataset.html = html;
      drawStaticCharts(el);
    }
    setLive(true);
  }

  // ------------------------------------------------------------------------- actions

  document.addEventListener("click", async (ev) => {
    const button = ev.target.closest("button[data-action]");
    if (!button) return;
    const job = button.dataset.job;
    const action = button.dataset.action;
    if (action === "terminate" && !window.confirm(`Terminate job ${job}? Its workers are stopped and it ends FAILED.`)) return;
    button.disabled = true;
    try {
      const result = await act("POST", `/jobs/${encodeURIComponent(job)}/${action}`);
      flash(`${action === "cancel" ? "Cancelled" : "Terminating"} ${result.name}: ${result.status}`);
      await refreshParts();
    } catch (e) {
      flash(`${action} refused: ${e.message}`, true);
      button.disabled = false;
    }
  });

  document.addEventListener("submit", async (ev) => {
    const form = ev.target.closest("form[data-action=desired]");
    if (!form) return;
    ev.preventDefault();
    const input = form.querySelector("input[name=desired_slots]");
    const env = form.dataset.env;
    try {
      const ce = await act("PATCH", `/compute-environments/${encodeURIComponent(env)}`,
        { desired_slots: Number(input.value) });
      flash(`${env}: desired ${ce.desired_slots} slot(s)`);
      input.blur();
      await refreshParts();
    } catch (e) {
      flash(`${env}: ${e.message}`, true);
    }
  });

  // Filter chips submit the overview's filter form at once.
  const filters = document.getElementById("job-filters");
  if (filters) {
    filters.addEventListener("change", (ev) => { if (ev.target.name === "state" || ev.target.name === "queue") filters.requestSubmit(); });
    filters.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const data = new FormData(filters);
      const params = new URLSearchParams();
      const states = data.getAll("state");
      if (states.length) params.set("status", states.join(","));
      if (data.get("queue")) params.set("queue", data.get("queue"));
      if (data.get("q")) params.set("q", data.get("q"));
      const query = params.toString();
      window.location.assign("/" + (query ? "?" + query : ""));
    });
  }

  // ------------------------------------------------------------------------- charts

  function chartWidth(el) { return Math.max(280, el.clientWidth || el.parentElement.clientWidth || 600); }

  function makeChart(el, opts, data) {
    el.innerHTML = "";
    const chart = new uPlot({ width: chartWidth(el), height: opts.height || 240, ...opts }, data, el);
    new ResizeObserver(() => {
      const w = chartWidth(el);
      if (Math.abs(w - chart.width) > 2) chart.setSize({ width: w, height: chart.height });
    }).observe(el);
    // the legend's marker of a dashed series is dashed too (uPlot draws every marker solid)
    const dashed = new Set((opts.series || []).filter((s) => s.dash).map((s) => s.label));
    for (const row of chart.root.querySelectorAll(".u-legend .u-series")) {
      const marker = row.querySelector(".u-marker"), label = row.querySelector(".u-label");
      if (marker && label && dashed.has(label.textContent)) marker.style.borderStyle = "dashed";
    }
    return chart;
  }

  function noData(el, text) { el.innerHTML = `<p class="no-data">${text}</p>`; }

  // Vertical marks (a line, a band and a label) drawn over a chart, in the x scale's units.
  // Labels sit on a light backing, right of their line (left of it near the right edge), each
  // on the first of four rows where it overlaps no other label; one that fits on none is left
  // out (the membership table lists every change).
  function markerPlugin(getMarks) {
    const ROWS = 4;
    return {
      hooks: {
        draw: [(u) => {
          const ctx = u.ctx;
          const px = devicePixelRatio;
          const { left, top, width, height } = u.bbox;
          ctx.save();
          ctx.font = `${11 * px}px system-ui, sans-serif`;
          ctx.textAlign = "left";
          ctx.textBaseline = "alphabetic";
          const rowEnds = new Array(ROWS).fill(-Infinity);
          const labels = [];
          for (const m of getMarks()) {
            const x0 = u.valToPos(m.from, "x", true);
            const x1 = u.valToPos(m.to === undefined ? m.from : m.to, "x", true);
            if (x1 < left || x0 > left + width) continue;
            ctx.fillStyle = m.colour + "26";
            if (x1 - x0 >= 1) ctx.fillRect(x0, top, x1 - x0, height);
            ctx.strokeStyle = m.colour;
            ctx.lineWidth = px;
            ctx.setLineDash([4 * px, 3 * px]);
            ctx.beginPath(); ctx.moveTo(x0, top); ctx.lineTo(x0, top + height); ctx.stroke();
            if (!m.label) continue;
            const w = ctx.measureText(m.label).width + 4 * px;
            const x = x0 + 3 * px + w > left + width ? x0 - 3 * px - w : x0 + 3 * px;
            const row = rowEnds.findIndex((end) => end <= x);
            if (row < 0) continue;
            rowEnds[row] = x + w + 4 * px;
            labels.push({ x, w, row, text: m.label, colour: m.colour });
          }
          ctx.setLineDash([]);
          for (const l of labels) {
            const y = top + (4 + 14 * l.row) * px;
            ctx.fillStyle = "rgba(255, 255, 255, 0.85)";
            ctx.fillRect(l.x, y, l.w, 13 * px);
            ctx.fillStyle = l.colour;
            ctx.fillText(l.text, l.x + 2 * px, y + 10 * px);
          }
          ctx.restore();
        }],
      },
    };
  }

  // ------------------------------------------------------------------------- overview

  function capacityChart() {
    const el = document.getElementById("capacity-chart");
    if (!el) return null;
    let chart = null;
    let names = "";
    return async () => {
      const data = await getJSON(el.dataset.src);
      if (!data.environments.length) { noData(el, "No compute environments."); chart = null; return; }
      const cols = [data.t];
      for (const env of data.environments) cols.push(env.available, env.in_use);
      const key = data.environments.map((e) => e.name).join("|");
      if (!chart || key !== names) {
        const series = [{}];
        const colours = envColours(data.environments);
        data.environments.forEach((env, i) => {
          const colour = colours[i];
          series.push({ label: `${env.name} available`, stroke: colour, width: 2, points: { show: false },
            paths: uPlot.paths.stepped({ align: 1 }) });
          series.push({ label: `${env.name} in use`, stroke: colour, width: 1.5, dash: [5, 4], points: { show: false },
            paths: uPlot.paths.stepped({ align: 1 }) });
        });
        chart = makeChart(el, { height: 220, series, legend: { live: false }, scales: { y: { range: (u, lo, hi) => [0, Math.max(1, hi + 0.5)] } },
          axes: [{}, { label: "slots", incrs: [1, 2, 5, 10, 20, 50, 100] }] }, cols);
        names = key;
      } else {
        chart.setData(cols);
      }
    };
  }

  // ------------------------------------------------------------------------- a job

  function jobCharts(jobId) {
    const els = {
      world: document.getElementById("world-chart"), loss: document.getElementById("loss-chart"),
      speed: document.getElementById("speed-chart"), noise: document.getElementById("noise-chart"),
    };
    if (!els.world) return null;
    const rows = { step: [], time: [], world_size: [], loss: [], samples_per_s: [], b_simple: [] };
    let offset = 0;
    let changes = [];
    const charts = {};
    const timeMarks = () => changes.map((c) => ({ from: c.requested_at, to: c.first_step_at,
      colour: KIND_COLOURS[c.kind] || "#667085",
      label: `${c.kind}${c.latency_s != null ? " " + fmtSeconds(c.latency_s) : ""}` }));
    const stepMarks = () => changes.filter((c) => c.start_step != null).map((c) => ({
      from: c.start_step, colour: KIND_COLOURS[c.kind] || "#667085", label: "" }));

    function speedupChart(s) {
      // the model at every size from 1 to the job's max; the measured medians on the same axis
      const measured = s.model.w.map((w) => { const i = s.points.w.indexOf(w); return i < 0 ? null : s.points.samples_per_s[i]; });
      const data = [s.model.w, s.model.samples_per_s, measured];
      document.getElementById("speedup-block").hidden = false;
      if (!charts.speedup) {
        charts.speedup = makeChart(document.getElementById("speedup-chart"), {
          height: 230, scales: { x: { time: false } },
          series: [{ label: "workers" }, { label: "model", stroke: "#2f6fdf", width: 1.5, points: { show: false } },
            { label: "measured (median)", stroke: "#1f9d55", width: 0, points: { show: true, size: 8, fill: "#1f9d55" } }],
          axes: [{ label: "workers", incrs: [1, 2, 5, 10, 20, 50, 100] }, { label: "samples/s" }],
        }, data);
      } else {
        charts.speedup.setData(data);
      }
    }

    function stepChart(name, el, label, colour, values) {
      const data = [rows.step, values];
      if (!charts[name]) {
        charts[name] = makeChart(el, {
          height: 230, scales: { x: { time: false } }, plugins: [markerPlugin(stepMarks)], legend: { show: false },
          series: [{ label: "step" }, { label, stroke: colour, width: 1.5, spanGaps: true }],
          axes: [{ label: "step" }, { label }],
        }, data);
      } else {
        charts[name].setData(data);
      }
    }

    return async () => {
      const data = await getJSON(`/ui/data/jobs/${encodeURIComponent(jobId)}/series?offset=${offset}`);
      offset = data.offset;
      for (const key of Object.keys(rows)) rows[key].push(...(data.rows[key] || []));
      changes = data.changes;
      const tl = data.timeline;
      if (tl.t.length) {
        const worldData = [tl.t, tl.world];
        if (!charts.world) {
          charts.world = makeChart(els.world, {
            height: 250, plugins: [markerPlugin(timeMarks)], legend: { show: false },
            series: [{}, { label: "world size", stroke: "#2f6fdf", width: 2, fill: "#2f6fdf1f", points: { show: false },
              paths: uPlot.paths.stepped({ align: 1 }) }],
            scales: { y: { range: (u, lo, hi) => [0, Math.max(3, Math.ceil(hi * 1.5))] } },  // room for the labels
            axes: [{}, { label: "workers", incrs: [1, 2, 5, 10, 20, 50, 100] }],
          }, worldData);
        } else {
          charts.world.setData(worldData);
        }
      } else if (!charts.world) {
        noData(els.world, "The job has not started yet.");
      }
      if (rows.step.length) {
        stepChart("loss", els.loss, "loss", "#d64545", rows.loss);
        stepChart("speed", els.speed, "samples/s", "#1f9d55", rows.samples_per_s);
        if (rows.b_simple.some((v) => v != null)) {
          document.getElementById("noise-block").hidden = false;
          stepChart("noise", els.noise, "B_simple", "#7b4fd6", rows.b_simple);
        }
      } else {
        if (!charts.loss) noData(els.loss, "No step yet.");
        if (!charts.speed) noData(els.speed, "No step yet.");
      }
      if (data.speedup) speedupChart(data.speedup);
      const worldNow = document.getElementById("world-now");
      if (worldNow && rows.world_size.length && data.status === "RUNNING") worldNow.title = `last step ran on ${rows.world_size[rows.world_size.length - 1]} worker(s)`;
    };
  }

  function fmtSeconds(s) { return s < 1 ? `${Math.round(s * 1000)} ms` : `${s.toFixed(1)} s`; }

  function followLogs() {
    const el = document.getElementById("log");
    if (!el) return;
    const follow = document.getElementById("follow");
    let after = 0;
    let finished = false;
    const poll = async () => {
      if (finished) return;
      const data = await getJSON(`${el.dataset.src}?after_seq=${after}&limit=2000`);
      if (data.lines.length) {
        document.getElementById("log-empty")?.remove();
        const frag = document.createDocumentFragment();
        for (const line of data.lines) {
          const span = document.createElement("span");
          span.className = "w";
          span.textContent = (line.worker ? line.worker.replace(/^([0-9a-f]{8})[0-9a-f]{24}/, "$1") : "service") + " │ ";
          frag.append(span, document.createTextNode(line.line + "\n"));
        }
        el.append(frag);
        after = data.last_seq;
        if (follow && follow.checked) el.scrollTop = el.scrollHeight;
      } else if (data.done) {
        finished = true;
        const end = document.createElement("span");
        end.className = "meta";
        end.textContent = `— end of log: the job ${data.status} —\n`;
        el.append(end);
        if (follow && follow.checked) el.scrollTop = el.scrollHeight;
      }
    };
    every(LOG_POLL_MS, poll);
  }

  // ------------------------------------------------------------------------- lab

  function drawStaticCharts(root) {
    for (const el of root.querySelectorAll("[data-chart=steps-vs-batch]")) {
      const spec = JSON.parse(el.querySelector("script").textContent);
      const measured = spec.points.filter((p) => p.steps != null);
      if (!measured.length) { noData(el, "No batch size reached the target yet."); continue; }
      const bs = spec.points.map((p) => p.batch_size);
      const lo = Math.min(...bs), hi = Math.max(...bs);
      const xs = new Set(bs);
      for (let b = lo; b <= hi * 1.0001; b *= Math.pow(2, 0.25)) xs.add(b);
      const x = [...xs].sort((a, b) => a - b);
      const steps = new Map(measured.map((p) => [p.batch_size, p.steps]));
      const fit = spec.fit;
      const data = [x, x.map((b) => steps.has(b) ? steps.get(b) : null),
        x.map((b) => fit ? fit.s_min * (1 + fit.b_crit / b) : null)];
      const marks = fit ? [{ from: fit.b_crit, colour: "#7b4fd6", label: `B_crit ≈ ${fit.b_crit.toFixed(0)}` }] : [];
      makeChart(el, {
        height: 260, plugins: [markerPlugin(() => marks)], legend: { live: false },
        // padded so that no point sits on the chart's edge
        scales: { x: { time: false, distr: 3, log: 2, range: (u, lo, hi) => [lo / 1.25, hi * 1.25] },
          y: { distr: 3, log: 10, range: (u, lo, hi) => [lo / 1.5, hi * 1.5] } },
        series: [{ label: "batch size" },
          { label: "steps to result", stroke: "#2f6fdf", width: 0, paths: () => null, points: { show: true, size: 8, fill: "#2f6fdf" } },
          { label: "fit S(B)", stroke: "#d64545", width: 1.5, dash: [6, 4], points: { show: false } }],
        axes: [{ label: "batch size", splits: () => [...new Set(bs)].sort((a, b) => a - b) }, { label: "steps" }],
      }, data);
    }
  }

  // ------------------------------------------------------------------------- start

  const tasks = [];
  if (body.dataset.parts) tasks.push(refreshParts);
  if (page === "overview") { const c = capacityChart(); if (c) tasks.push(c); }
  if (page === "job" && body.dataset.elastic === "yes") { const c = jobCharts(body.dataset.job); if (c) tasks.push(c); }
  if (page === "job") followLogs();
  drawStaticCharts(document);
  if (tasks.length) {
    // the first poll draws the charts at once; the parts were rendered with the page
    let first = true;
    every(POLL_MS, async () => {
      for (const task of tasks) {
        if (first && task === refreshParts) continue;
        await task();
      }
      first = false;
      setLive(true);
    });
  } else {
    setLive(true);
  }
})();
