// bandgate console: reads /v1/console/overview every few seconds and draws it; lists,
// replays and purges dead letters through the admin endpoints. Plain JS, no build step.
"use strict";

const COLORS = ["#d62828", "#f77f00", "#277da1", "#6a4c93", "#52796f", "#8a93a0"];
const TOKEN_KEY = "bandgate.token";
const built = new Map(); // queue name -> its section's parts

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  for (const child of children) node.append(child);
  return node;
}

function svg(tag, attrs = {}) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  return node;
}

function headers(extra = {}) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { ...extra, authorization: "Bearer " + token } : extra;
}

async function api(method, path, body) {
  const init = { method, headers: headers(body ? { "content-type": "application/json" } : {}) };
  if (body) init.body = JSON.stringify(body);
  const response = await fetch(path, init);
  if (!response.ok) {
    let message = response.status + " " + response.statusText;
    try { message = (await response.json()).error.message; } catch (e) { /* not JSON */ }
    const error = new Error(message);
    error.status = response.status;
    throw error;
  }
  return response;
}

function count(value) { return value === null || value === undefined ? "–" : String(value); }
function rate(value) { return value === null || value === undefined ? "–" : value.toFixed(1) + "/s"; }
function age(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 1) return Math.round(seconds * 1000) + " ms";
  if (seconds < 120) return seconds.toFixed(1) + " s";
  if (seconds < 7200) return (seconds / 60).toFixed(1) + " min";
  return (seconds / 3600).toFixed(1) + " h";
}

function notice(text) { document.getElementById("notice").textContent = text || ""; }

function buildQueue(name, admin) {
  const summary = el("p", { class: "summary" });
  const tbody = el("tbody");
  const table = el("table", { class: "bands" },
    el("thead", {}, el("tr", {}, ...["band", "ready", "unacked", "consumers", "oldest",
      "wait now", "p50", "p99", "in", "out"].map((h) => el("th", {}, h)))), tbody);
  const chart = svg("svg", { class: "chart", width: "400", height: "170", viewBox: "0 0 400 170" });
  const section = el("section", { class: "queue", id: "q-" + name },
    el("h2", {}, name), summary, el("div", { class: "row" }, table, chart));
  if (admin) section.append(buildDeadLetters(name));
  document.getElementById("queues").append(section);
  const parts = { summary, tbody, chart };
  built.set(name, parts);
  return parts;
}

function drawQueue(queue, windowSeconds) {
  const parts = built.get(queue.queue);
  parts.summary.replaceChildren(
    ...[["in", rate(queue.publish_rate)], ["out", rate(queue.deliver_rate)],
      ["delayed", count(queue.delayed)], ["dead-lettered", count(queue.dead_lettered)]]
      .map(([label, value]) => el("span", { class: label }, label + " ", el("b", {}, value))),
    queue.problem ? el("span", { class: "danger" }, queue.problem) : "");
  parts.tbody.replaceChildren(...queue.bands.map((band, index) => {
    const swatch = el("span", { class: "swatch" });
    swatch.style.background = COLORS[index % COLORS.length];
    const wait = age(band.wait_seconds) + (band.wait_source && band.wait_source !== "empty"
      ? " (" + band.wait_source + ")" : "");
    return el("tr", { "data-band": band.band },
      el("td", { class: "band" }, swatch, band.band),
      el("td", { class: "ready" }, count(band.ready)),
      el("td", { class: "unacked" }, count(band.unacked)),
      el("td", { class: "consumers" }, count(band.consumers)),
      el("td", { class: "oldest" }, age(band.oldest_ready_age_seconds)),
      el("td", { class: "wait" }, wait),
      el("td", { class: "p50" }, age(band.wait_p50_seconds)),
      el("td", { class: "p99" }, age(band.wait_p99_seconds)),
      el("td", { class: "in" }, rate(band.publish_rate)),
      el("td", { class: "out" }, rate(band.deliver_rate)));
  }));
  drawChart(parts.chart, queue, windowSeconds);
}

function drawChart(chart, queue, windowSeconds) {
  const [left, top, width, height] = [44, 10, 346, 130];
  // The x axis spans what the gateway has seen (at least a minute), up to the whole window.
  let highest = 1;
  let span = 60;
  for (const points of Object.values(queue.chart)) {
    for (const [ago, wait] of points) {
      if (wait !== null && wait > highest) highest = wait;
      span = Math.max(span, Math.min(-ago, windowSeconds));
    }
  }
  const x = (ago) => left + width * (1 + Math.max(ago, -span) / span);
  const y = (wait) => top + height * (1 - wait / highest);
  const nodes = [
    svg("line", { x1: left, y1: top + height, x2: left + width, y2: top + height, stroke: "#c5cad3" }),
    svg("line", { x1: left, y1: top, x2: left, y2: top + height, stroke: "#c5cad3" }),
  ];
  const label = (text, attrs) => { const node = svg("text", attrs); node.textContent = text; return node; };
  nodes.push(label(age(highest), { x: 2, y: top + 8 }), label("0", { x: 30, y: top + height }));
  nodes.push(label("-" + age(span), { x: left, y: top + height + 14 }));
  nodes.push(label("now", { x: left + width - 18, y: top + height + 14 }));
  nodes.push(label("wait per band", { x: left + width - 80, y: top + 8 }));
  queue.bands.forEach((band, index) => {
    const color = COLORS[index % COLORS.length];
    const points = (queue.chart[band.band] || []).filter(([, wait]) => wait !== null)
      .map(([ago, wait]) => x(ago).toFixed(1) + "," + y(wait).toFixed(1));
    if (points.length) {
      nodes.push(svg("polyline", { points: points.join(" "), fill: "none", stroke: color,
        "stroke-width": "2", "data-band": band.band }));
    }
    nodes.push(label(band.band, { x: left + 8 + index * 60, y: top + height + 28, fill: color }));
  });
  chart.replaceChildren(...nodes);
}

function buildDeadLetters(name) {
  const reason = el("input", { class: "reason", placeholder: "reason contains…", size: "18" });
  const list = el("button", { type: "button", class: "list" }, "List");
  const replaySelected = el("button", { type: "button", class: "replay-selected" }, "Replay selected");
  const replayReason = el("button", { type: "button", class: "replay-reason" }, "Replay all of this reason");
  const progress = el("progress", { class: "replay-progress", max: "1", value: "0" });
  const status = el("span", { class: "replay-status" });
  const listed = el("p", { class: "dlq-count muted" });
  const confirm = el("input", { class: "purge-confirm", placeholder: "type " + name + " to purge", size: "16" });
  const purge = el("button", { type: "button", class: "purge danger", disabled: "" }, "Purge");
  const tbody = el("tbody");
  const table = el("table", { class: "dead-letters" }, el("thead", {}, el("tr", {},
    ...["", "message id", "reason", "cause", "attempts", "original band", "age"].map((h) => el("th", {}, h)))),
    tbody);
  const refresh = async () => {
    const query = new URLSearchParams({ limit: "200" });
    if (reason.value.trim()) query.set("reason", reason.value.trim());
    try {
      const body = await (await api("GET", "/v1/queues/" + name + "/dlq?" + query)).json();
      listed.textContent = body.count + " in the dead-letter queue, " + body.messages.length + " shown";
      tbody.replaceChildren(...body.messages.map((m) => el("tr", { "data-id": m.message_id },
        el("td", {}, el("input", { type: "checkbox", class: "pick", value: m.message_id })),
        el("td", {}, m.message_id), el("td", {}, m.reason || "–"), el("td", {}, m.cause || "–"),
        el("td", {}, count(m.attempts)), el("td", {}, m.original_band || "–"),
        el("td", {}, age(m.age_seconds)))));
    } catch (error) { listed.textContent = error.message; }
  };
  const replay = async (body) => {
    for (const button of [replaySelected, replayReason]) button.disabled = true;
    progress.value = 0;
    delete status.dataset.done;
    status.textContent = "replaying…";
    try {
      const response = await api("POST", "/v1/console/queues/" + name + "/dlq/replay", body);
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { done, value } = await reader.read();
        if (value) buffer += decoder.decode(value, { stream: true });
        const lines = buffer.split("\n");
        buffer = lines.pop();
        for (const line of lines.filter(Boolean)) {
          const step = JSON.parse(line);
          if (step.progress) {
            const wanted = body.message_ids ? body.message_ids.length : step.progress.total;
            progress.max = Math.max(wanted, 1);
            progress.value = step.progress.replayed;
            status.textContent = "replayed " + step.progress.replayed + " of " + wanted;
          } else if (step.result) {
            status.textContent = "replayed " + step.result.replayed +
              (step.result.error ? " — stopped: " + step.result.error : "") +
              (step.result.kept.length ? ", kept " + step.result.kept.length : "");
            status.dataset.done = "true";
          } else if (step.error) {
            status.textContent = "failed: " + step.error.message;
          }
        }
        if (done) break;
      }
      await refresh();
    } catch (error) {
      status.textContent = error.message;
    } finally {
      for (const button of [replaySelected, replayReason]) button.disabled = false;
    }
  };
  list.addEventListener("click", refresh);
  replaySelected.addEventListener("click", () => {
    const ids = [...tbody.querySelectorAll("input.pick:checked")].map((box) => box.value);
    if (ids.length) replay({ message_ids: ids });
    else status.textContent = "select dead letters first";
  });
  replayReason.addEventListener("click", () => {
    if (reason.value.trim()) replay({ reason: reason.value.trim() });
    else status.textContent = "type a reason first (every dead letter: the CLI's dlq replay)";
  });
  confirm.addEventListener("input", () => { purge.disabled = confirm.value !== name; });
  purge.addEventListener("click", async () => {
    if (confirm.value !== name) return;
    try {
      const body = await (await api("DELETE", "/v1/queues/" + name + "/dlq")).json();
      status.textContent = "purged " + body.purged;
      confirm.value = "";
      purge.disabled = true;
      await refresh();
    } catch (error) { status.textContent = error.message; }
  });
  const panel = el("div", { class: "dlq" }, el("h3", {}, "Dead letters"),
    el("div", { class: "controls" }, reason, list, replaySelected, replayReason, progress, status),
    listed, table, el("div", { class: "controls" }, confirm, purge));
  refresh();
  return panel;
}

async function poll() {
  try {
    const data = await (await api("GET", "/v1/console/overview")).json();
    notice(data.management ? "" : "no management URL: unacked, rates and estimated waits are unknown");
    document.getElementById("whoami").textContent = "token: " + data.token;
    for (const queue of data.queues) {
      if (!built.has(queue.queue)) buildQueue(queue.queue, data.admin);
      drawQueue(queue, data.window_seconds);
    }
    document.body.dataset.loaded = "true";
  } catch (error) {
    notice(error.status === 401 ? "paste a token with read:<queue> or admin" : error.message);
    document.body.dataset.refused = String(error.status || "error");
  }
}

function start() {
  document.getElementById("login").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value.trim());
    document.getElementById("token").value = "";
    built.clear();
    document.getElementById("queues").replaceChildren();
    delete document.body.dataset.refused;
    poll();
  });
  document.getElementById("forget").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    location.reload();
  });
  poll();
  setInterval(poll, 2000);
}

document.addEventListener("DOMContentLoaded", start);
