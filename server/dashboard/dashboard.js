// The Ballast dashboard: a job list, and a job page whose charts follow the
// job live through the event stream of the JSON API (docs/http-api.md).
// Plain JavaScript, no dependencies; it talks only to the ballastd that
// served it. ballastd serves it under a Content-Security-Policy that admits
// no inline script or style (docs/security.md): text goes into the page as
// text nodes, never markup, and styles are set through element.style.
"use strict";

const app = document.getElementById("app");
const status = document.getElementById("status");
let stopView = () => {};

// --- the API ------------------------------------------------------------

function token() { return localStorage.getItem("ballast-token") || ""; }

function headers() {
  return token() ? { Authorization: "Bearer " + token() } : {};
}

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path) {
  const response = await fetch(path, { headers: headers() });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new ApiError(response.status, body.error || response.statusText);
  return body;
}

// Calls onEvent(event) for each event of the job after `after`, live, until
// the job ends (then onEnd()) or stop() is called. The server closes a stream
// after a while; it is reopened from the last seq seen.
function followEvents(jobId, after, onEvent, onEnd) {
  const controller = new AbortController();
  let last = after;
  let stopped = false;
  (async () => {
    while (!stopped) {
      let ended = false;
      try {
        const response = await fetch(
            `/api/v1/jobs/${encodeURIComponent(jobId)}/stream?after=${last}`,
            { headers: headers(), signal: controller.signal });
        if (!response.ok) throw new Error(`stream: HTTP ${response.status}`);
        const reader = response.body.getReader();
        const decoder = new TextDecoder();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += decoder.decode(value, { stream: true });
          let cut;
          while ((cut = buffer.indexOf("\n\n")) >= 0) {
            const frame = buffer.slice(0, cut);
            buffer = buffer.slice(cut + 2);
            const fields = {};
            for (const line of frame.split("\n")) {
              const colon = line.indexOf(":");
              if (colon <= 0) continue;
              fields[line.slice(0, colon)] = line.slice(colon + 1).trimStart();
            }
            if (fields.event === "end") { ended = true; continue; }
            if (fields.data === undefined) continue;
            const event = JSON.parse(fields.data);
            last = Number(event.seq);
            onEvent(event);
          }
        }
      } catch (e) {
        if (stopped) return;
        status.textContent = String(e.message || e);
        await new Promise((r) => setTimeout(r, 2000));
      }
      if (ended) { onEnd(); return; }
    }
  })();
  return () => { stopped = true; controller.abort(); };
}

// --- small helpers --------------------------------------------------------

function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attributes)) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : String(c));
  return node;
}

function svgEl(tag, attributes = {}) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attributes)) node.setAttribute(k, v);
  return node;
}

// Text that a user or a rank wrote (job names, messages, paths, tenants):
// inside <bdi>, so that right-to-left text cannot reorder what is around it;
// with its bidi embedding, override and isolate controls shown as [U+202E],
// so that it cannot hide what it says; and at most `max` characters, so that
// a 100 kB line does not take the page.
const BIDI_CONTROLS = /[\u202a-\u202e\u2066-\u2069]/g;
const showBidiControls = (text) =>
  text.replace(BIDI_CONTROLS, (c) => `[U+${c.charCodeAt(0).toString(16).toUpperCase()}]`);

function userText(value, max = 2000) {
  let text = String(value ?? "");
  let more = 0;
  if (text.length > max) {
    const end = /[\ud800-\udbff]/.test(text[max - 1]) ? max - 1 : max;  // not half a character
    more = text.length - end;
    text = text.slice(0, end);
  }
  const node = el("bdi", { class: "user" }, showBidiControls(text));
  if (more) node.append(el("span", { class: "muted" }, ` … [${more} more characters]`));
  return node;
}

// A progress bar `fraction` full; its width is set through the CSSOM, which
// the Content-Security-Policy admits (a style attribute it would refuse).
function bar(fraction, title = "") {
  const fill = el("div");
  fill.style.width = `${100 * Math.min(Math.max(fraction, 0), 1)}%`;
  return el("div", { class: "bar", title }, fill);
}

const stateName = (s) => String(s || "").replace("JOB_STATE_", "");
const fmt = (x, digits = 4) =>
  x === undefined || x === null || !isFinite(x) ? "—" : Number(x).toPrecision(digits);

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  for (n = Number(n); n >= 1024 && i < units.length - 1; i++) n /= 1024;
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function showError(e) {
  if (e instanceof ApiError && e.status === 401) return askToken(e.message);
  app.replaceChildren(el("p", { class: "error" }, String(e.message || e)));
}

function askToken(message) {
  const input = el("input", { type: "password", placeholder: "BALLAST_TOKEN", id: "token" });
  const form = el("form", { class: "token" }, input, el("button", {}, "Use token"));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    localStorage.setItem("ballast-token", input.value);
    route();
  });
  app.replaceChildren(el("p", {}, message), form);
}

// --- charts ---------------------------------------------------------------

// A line chart of points [{step, value, skipped, run}] with rollbacks
// [{step, to_step}] as dashed lines: one polyline per run (a rollback's
// re-run starts a new one), skipped steps as dots at the top.
// `dots`: a second series drawn as marked points ({step, value, run}), named
// `dotLabel` in their tooltips: the validation loss on the loss chart.
function chart(svg, points, rollbacks,
               { log = false, color = "#1f77b4", dots = [], dotLabel = "eval_loss" } = {}) {
  const W = 560, H = 220, L = 56, R = 8, T = 10, B = 24;
  svg.replaceChildren();
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const good = points.filter((p) => !p.skipped && isFinite(p.value) && (!log || p.value > 0));
  const goodDots = dots.filter((d) => isFinite(d.value) && (!log || d.value > 0));
  const steps = points.concat(dots).map((p) => p.step);
  const x0 = Math.min(...steps, 1), x1 = Math.max(...steps, x0 + 1);
  const values = good.concat(goodDots).map((p) => p.value);
  let y0 = Math.min(...values), y1 = Math.max(...values);
  if (!values.length) { y0 = log ? 0.1 : 0; y1 = log ? 10 : 1; }
  if (log) { y0 = Math.pow(10, Math.floor(Math.log10(y0))); y1 = Math.pow(10, Math.ceil(Math.log10(y1) + 1e-9)); }
  if (y1 - y0 < 1e-12) { y0 -= 0.5; y1 += 0.5; }
  const f = (v) => (log ? Math.log10(v) : v);
  const X = (s) => L + ((s - x0) / (x1 - x0)) * (W - L - R);
  const Y = (v) => T + (1 - (f(v) - f(y0)) / (f(y1) - f(y0))) * (H - T - B);
  svg.append(svgEl("rect", { class: "axis", x: L, y: T, width: W - L - R, height: H - T - B }));
  for (const v of log ? [y0, Math.sqrt(y0 * y1), y1] : [y0, (y0 + y1) / 2, y1]) {
    const t = svgEl("text", { x: L - 4, y: Y(v) + 4, "text-anchor": "end" });
    t.textContent = fmt(v, 3);
    svg.append(t);
  }
  for (const s of [x0, Math.round((x0 + x1) / 2), x1]) {
    const t = svgEl("text", { x: X(s), y: H - 6, "text-anchor": "middle" });
    t.textContent = s;
    svg.append(t);
  }
  let run = null, line = [];
  const flush = () => {
    if (line.length) {
      svg.append(svgEl("polyline", { points: line.join(" "), stroke: color }));
    }
    line = [];
  };
  for (const p of points) {
    if (p.run !== run) { flush(); run = p.run; }
    if (p.skipped || !isFinite(p.value) || (log && p.value <= 0)) {
      flush();
      if (p.skipped) svg.append(svgEl("circle", { class: "skipped", cx: X(p.step), cy: T + 5, r: 3 }));
      continue;
    }
    line.push(`${X(p.step).toFixed(1)},${Y(p.value).toFixed(1)}`);
  }
  flush();
  let dotRun = null, dotLine = [];
  const flushDots = () => {
    if (dotLine.length > 1) svg.append(svgEl("polyline", { class: "dots", points: dotLine.join(" ") }));
    dotLine = [];
  };
  for (const d of goodDots) {
    if (d.run !== dotRun) { flushDots(); dotRun = d.run; }
    dotLine.push(`${X(d.step).toFixed(1)},${Y(d.value).toFixed(1)}`);
    const dot = svgEl("circle", { class: "dot", cx: X(d.step), cy: Y(d.value), r: 3 });
    const title = svgEl("title");
    title.textContent = `${dotLabel} ${fmt(d.value)} at step ${d.step}`;
    dot.append(title);
    svg.append(dot);
  }
  flushDots();
  for (const r of rollbacks) {
    const g = svgEl("line", { class: "rollback", x1: X(r.step), x2: X(r.step), y1: T, y2: H - B });
    const title = svgEl("title");
    title.textContent = `step ${r.step}: rolled back to step ${r.to_step}`;
    g.append(title);
    svg.append(g);
  }
  svg.dataset.points = good.length;
  svg.dataset.dots = goodDots.length;
}

// --- the job list -----------------------------------------------------------

async function listView() {
  const table = el("table", { id: "jobs" },
    el("thead", {}, el("tr", {}, ...["Job", "Name", "Tenant", "State", "Progress", "Last loss",
                                     "Restarts", "Submitted"].map((h) => el("th", {}, h)))),
    el("tbody"));
  app.replaceChildren(el("h1", {}, "Jobs"), table);
  const refresh = async () => {
    const { jobs = [] } = await api("/api/v1/jobs?limit=200");
    const rows = jobs.map((j) => {
      const step = Number(j.step || 0), max = Number(j.spec?.max_steps || 0);
      const state = stateName(j.state);
      return el("tr", { "data-job": j.id },
        el("td", {}, el("a", { href: `#/jobs/${encodeURIComponent(j.id)}` }, j.id)),
        el("td", { class: "name" }, userText(j.spec?.name || "", 200)),
        el("td", {}, userText(j.tenant || "", 64)),
        el("td", { class: `state ${state}` }, state),
        el("td", {}, bar(max ? step / max : 0, `${step}/${max}`), ` ${step}/${max}`),
        el("td", {}, fmt(j.last_step?.loss)),
        el("td", {}, j.restarts || 0),
        el("td", {}, new Date(Number(j.created_ms)).toLocaleString()));
    });
    table.tBodies[0].replaceChildren(...rows);
    if (!rows.length) table.tBodies[0].append(el("tr", {}, el("td", { colspan: 8, class: "muted" }, "No jobs yet.")));
    status.textContent = `${jobs.length} jobs · updated ${new Date().toLocaleTimeString()}`;
  };
  await refresh();
  const timer = setInterval(() => refresh().catch(showError), 2000);
  return () => clearInterval(timer);
}

// --- one job ----------------------------------------------------------------

async function jobView(jobId, current) {
  const job = await api(`/api/v1/jobs/${encodeURIComponent(jobId)}`);
  if (!current()) return () => {};
  const facts = el("div", { class: "facts", id: "facts" });
  const charts = {
    loss: svgEl("svg", { class: "chart", id: "chart-loss" }),
    grad_norm: svgEl("svg", { class: "chart", id: "chart-grad-norm" }),
    lr: svgEl("svg", { class: "chart", id: "chart-lr" }),
    // A Mixture-of-Experts job's routing; their cards appear with its first step.
    aux_loss: svgEl("svg", { class: "chart", id: "chart-moe-aux-loss" }),
    load_ratio: svgEl("svg", { class: "chart", id: "chart-moe-load-ratio" }),
    // A reranker's held-out ranking; its card appears with its first evaluation.
    ranking: svgEl("svg", { class: "chart", id: "chart-ranking" }),
  };
  const ranks = el("table", { id: "ranks" });
  const log = el("div", { id: "log" });
  const card = (title, ...body) => el("div", { class: "card" }, el("h2", {}, title), ...body);
  const grid = el("div", { class: "grid" },
    card("Loss, and eval_loss (dots)", charts.loss),
    card("Global grad_norm (log scale)", charts.grad_norm),
    card("Learning rate", charts.lr), card("Step time per rank", ranks),
    card("Events", log),
    card("Spec",
         el("pre", { class: "spec" }, showBidiControls(JSON.stringify(job.spec, null, 2)))));
  app.replaceChildren(
    el("h1", {}, `${job.id} `, el("span", { class: "muted" }, userText(job.spec?.name || "", 200))),
    facts, grid);
  let moe = false;
  const showMoe = () => {
    if (moe) return;
    moe = true;
    grid.insertBefore(card("MoE load-balancing loss (without its coefficient)", charts.aux_loss), grid.children[3]);
    grid.insertBefore(card("MoE expert load, max / mean, least balanced layer", charts.load_ratio), grid.children[4]);
  };
  let ranking = false;
  const showRanking = () => {
    if (ranking) return;
    ranking = true;
    grid.insertBefore(card("Held-out ranking: MRR@10, and NDCG@10 (dots)", charts.ranking), grid.children[1]);
  };

  const points = [];  // {step, loss, grad_norm, lr, aux_loss, load_ratio, skipped, run}
  const evals = [];  // {step, value: eval_loss, run}
  const mrr = [], ndcg = [];  // a reranker's evaluations: {step, value, run}
  const rollbacks = [];
  let run = 0, lastStep = 0, lastAttempt = null, pending = false;
  const draw = () => {
    pending = false;
    const series = (key) => points.map((p) => ({ step: p.step, value: p[key], skipped: p.skipped, run: p.run }));
    chart(charts.loss, series("loss"), rollbacks, { dots: evals });
    chart(charts.grad_norm, series("grad_norm"), rollbacks, { log: true, color: "#2ca02c" });
    chart(charts.lr, series("lr"), rollbacks, { color: "#9467bd" });
    if (moe) {
      chart(charts.aux_loss, series("aux_loss"), rollbacks, { color: "#d62728" });
      chart(charts.load_ratio, series("load_ratio"), rollbacks, { color: "#8c564b" });
    }
    if (ranking) {
      chart(charts.ranking, mrr, rollbacks, { color: "#ff7f0e", dots: ndcg, dotLabel: "NDCG@10" });
    }
  };
  const redraw = () => { if (!pending) { pending = true; requestAnimationFrame(draw); } };
  const addLog = (cls, text, time) => {
    const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    log.append(el("div", { class: cls }, `${new Date(Number(time)).toLocaleTimeString()}  `,
                  userText(text, 4000)));
    while (log.childElementCount > 1000) log.firstElementChild.remove();
    if (atBottom) log.scrollTop = log.scrollHeight;
  };

  const onEvent = (e) => {
    const t = e.training || {};
    if (e.state_change) {
      const c = e.state_change;
      addLog("state", `state ${stateName(c.from)} -> ${stateName(c.to)}: ${c.reason || ""}`, e.time_ms);
    } else if (t.step_metrics) {
      const m = t.step_metrics, step = Number(m.step);
      if ((lastAttempt !== null && e.attempt !== lastAttempt) || (points.length && step <= lastStep)) run++;
      lastAttempt = e.attempt; lastStep = step;
      const num = (v) => (v === undefined || v === null ? NaN : Number(v));
      if (m.moe || m.aux_loss !== undefined) showMoe();
      points.push({ step, loss: num(m.loss), grad_norm: num(m.grad_norm), lr: num(m.lr),
                    aux_loss: num(m.aux_loss), load_ratio: num(m.moe?.expert_load_max_ratio),
                    skipped: !!m.skipped, run });
      redraw();
    } else if (t.guard) {
      const g = t.guard;
      if (g.kind === "KIND_ROLLBACK") { rollbacks.push({ step: Number(g.step), to_step: Number(g.to_step) }); redraw(); }
      addLog("guard", g.message || g.kind, e.time_ms);
    } else if (t.log) {
      const level = ["info", "warning", "error"].includes(t.log.level) ? t.log.level : "info";
      addLog(level, `[rank ${t.log.rank || 0}] ${t.log.text}`, e.time_ms);
    } else if (t.checkpoint_saved) {
      addLog("info", `checkpoint step ${t.checkpoint_saved.step}: ${t.checkpoint_saved.path}`, e.time_ms);
    } else if (t.end) {
      addLog("info", `${t.end.stop_reason || `trained to step ${t.end.step || 0}`}; exported step ${t.end.exported_step || 0} (${t.end.export_reason || ""})`, e.time_ms);
    } else if (t.eval) {
      const step = Number(t.eval.step || 0);
      if (t.eval.loss !== undefined) {
        evals.push({ step, value: Number(t.eval.loss), run });
        redraw();
      } else if (t.eval.groups !== undefined) {
        showRanking();
        mrr.push({ step, value: Number(t.eval.mrr_at_10 || 0), run });
        ndcg.push({ step, value: Number(t.eval.ndcg_at_10 || 0), run });
        redraw();
      }
      addLog("info", `eval at step ${t.eval.step}: ${JSON.stringify(t.eval)}`, e.time_ms);
    }
  };

  const refresh = async () => {
    const j = await api(`/api/v1/jobs/${encodeURIComponent(jobId)}`);
    const state = stateName(j.state);
    const fact = (name, value) => el("div", {}, el("b", {}, name), value);
    facts.replaceChildren(
      fact("State", el("span", { class: `state ${state}`, id: "state" }, state)),
      fact("Tenant", userText(j.tenant || "", 64)),
      fact("Step", `${j.step || 0}/${j.spec?.max_steps || 0}`),
      fact("Loss", fmt(j.last_step?.loss)), fact("grad_norm", fmt(j.last_step?.grad_norm)),
      fact("Tokens/s", fmt(j.last_step?.tokens_per_s, 3)),
      ...(j.last_step?.moe ? [fact("Aux loss", fmt(j.last_step.aux_loss)),
                              fact("Max load ratio", fmt(j.last_step.moe.expert_load_max_ratio, 3))] : []),
      fact("Rollbacks", j.guard_rollbacks || 0), fact("Restarts", j.restarts || 0),
      fact("Checkpoint", j.checkpoint_step || "—"),
      // How training ended and which step's weights were exported, and why.
      ...(j.end ? [fact("Exported", userText(`step ${j.end.exported_step || 0}: ${j.end.export_reason || ""}`, 300))] : []),
      ...(j.end?.stop_reason ? [fact("Stopped", userText(j.end.stop_reason, 300))] : []));
    const { ranks: stats = [] } = await api(`/api/v1/jobs/${encodeURIComponent(jobId)}/ranks`);
    const slowest = Math.max(...stats.map((r) => r.step_seconds_mean), 1e-9);
    ranks.replaceChildren(
      el("tr", {}, ...["Rank", "Mean step", "", "Waiting", "Peak memory", "Sent"].map((h) => el("th", {}, h))),
      ...stats.map((r) => el("tr", { "data-rank": r.rank },
        el("td", {}, r.rank), el("td", {}, `${fmt(r.step_seconds_mean, 3)} s`),
        el("td", {}, bar(r.step_seconds_mean / slowest)),
        // The share of its steps the rank spent blocked on collectives.
        el("td", {}, r.steps > 0 ? `${(100 * r.collective_wait_seconds / (r.step_seconds_mean * r.steps)).toFixed(0)}%` : "—"),
        el("td", {}, bytes(r.peak_memory_bytes)), el("td", {}, bytes(r.communicated_bytes)))));
    status.textContent = `${state} · updated ${new Date().toLocaleTimeString()}`;
  };
  await refresh();
  const timer = setInterval(() => refresh().catch(showError), 2000);
  const stopStream = followEvents(jobId, 0, onEvent, () => refresh().catch(showError));
  return () => { clearInterval(timer); stopStream(); };
}

// --- routing ----------------------------------------------------------------

// Each hash change routes anew; a view that finishes loading after a later
// change has routed is stopped unseen, so the later view shows (an older job
// page once drew itself over the list, its timers running on).
let routes = 0;

async function route() {
  const mine = ++routes;
  const current = () => mine === routes;
  stopView();
  stopView = () => {};
  const match = location.hash.match(/^#\/jobs\/([^/]+)$/);
  try {
    const stop = match ? await jobView(decodeURIComponent(match[1]), current) : await listView();
    if (current()) stopView = stop; else stop();
  } catch (e) {
    if (current()) showError(e);
  }
}

window.addEventListener("hashchange", route);
route();
