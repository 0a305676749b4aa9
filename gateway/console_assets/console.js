// bandgate console: reads /v1/console/overview every 2 s and draws it; lists,
// replays and purges dead letters through the admin endpoints; cancels, replaces and
// escalates a message by id through the API's own routes. Plain JS, no build step.
"use strict";

const TOKEN_KEY = "bandgate.token";
const built = new Map(); // queue name -> its section's parts
let stopped = false; // a 401: polling waits for another token

// A band is drawn by its place among its queue's bands, hottest first, so that every queue's
// hottest band is red and its coldest blue; the ones between run from orange towards green.
// Lines also differ in dash and width (hottest solid and widest, coldest dotted, drawn on top),
// so lines that coincide stay apart.
const MIDDLE_DASHES = ["8 4", "10 3 2 3", "5 5", "12 4 2 4 2 4"];

function bandHue(index, count) {
  if (index === 0) return 0;
  if (index === count - 1) return 215;
  return 30 + (130 * (index - 1)) / (count - 2);
}

function hslHex(hue, saturation, lightness) {
  const f = (n) => {
    const k = (n + hue / 30) % 12;
    const value = lightness - saturation * Math.min(lightness, 1 - lightness) *
      Math.max(-1, Math.min(k - 3, 9 - k, 1));
    return Math.round(value * 255).toString(16).padStart(2, "0");
  };
  return "#" + f(0) + f(8) + f(4);
}

function bandStyle(index, count) {
  const coldest = count > 1 && index === count - 1;
  return {
    color: hslHex(bandHue(index, count), 0.7, 0.45),
    dash: index === 0 ? "" : coldest ? "2 3" : MIDDLE_DASHES[(index - 1) % MIDDLE_DASHES.length],
    width: index === 0 ? 3.5 : coldest ? 2 : 2.5,
  };
}

function strokeAttrs(style) {
  const attrs = { stroke: style.color, "stroke-width": String(style.width) };
  if (style.dash) attrs["stroke-dasharray"] = style.dash;
  return attrs;
}

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
    let code = null;
    try {
      const answer = (await response.json()).error;
      message = answer.message;
      code = answer.code;
    } catch (e) { /* not JSON */ }
    const error = new Error(message);
    error.status = response.status;
    error.code = code;
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

// The wait column says how the figure was found, and when it is only a bound (the gateway
// knows a backlog's age from its own samples alone).
function waitText(band) {
  const seconds = band.wait_seconds;
  switch (band.wait_source) {
    case "empty": return age(0);
    case "head": return age(seconds) + " (head)";
    case "estimate": return "≈ " + age(seconds) + " (estimate)";
    case "backlog":
      if (seconds === null || seconds === undefined) return "new backlog, age unknown";
      if (band.wait_bound === "at_most") return "≤ " + age(seconds) + " (new backlog)";
      return "≥ " + age(seconds) + " (backlog)";
    default: return "–";
  }
}

const WAIT_TITLES = {
  empty: "nothing is waiting in this band",
  head: "the age of the message at the head of the band",
  estimate: "ready ÷ delivery rate (Little's law)",
  backlog: "nothing drains this backlog: how long the gateway has seen it (a bound)",
};

function notice(text) { document.getElementById("notice").textContent = text || ""; }

function buildQueue(queue, admin) {
  const name = queue.queue;
  const summary = el("p", { class: "summary" });
  const tbody = el("tbody");
  const table = el("table", { class: "bands" },
    el("thead", {}, el("tr", {}, ...["band", "ready", "unacked", "consumers", "oldest",
      "wait now", "p50", "p99", "in", "out"].map((h) => el("th", {}, h)))), tbody);
  const chart = svg("svg", { class: "chart", width: "400", height: "150", viewBox: "0 0 400 150" });
  const legend = el("div", { class: "legend" });
  const section = el("section", { class: "queue", id: "q-" + name },
    el("h2", {}, name), summary,
    el("div", { class: "row" }, table, el("figure", { class: "wait-chart" }, chart, legend)));
  if (queue.may_publish) section.append(buildMessageActions(name, queue.bands.map((b) => b.band)));
  if (admin) section.append(buildDeadLetters(name));
  document.getElementById("queues").append(section);
  const parts = { summary, tbody, chart, legend };
  built.set(name, parts);
  return parts;
}

function drawQueue(queue, windowSeconds) {
  const parts = built.get(queue.queue);
  parts.summary.replaceChildren(
    ...[["in", rate(queue.publish_rate)], ["out", rate(queue.deliver_rate)],
      ["dead-lettered", count(queue.dead_lettered)]]
      .map(([label, value]) => el("span", { class: label }, label + " ", el("b", {}, value))),
    queue.problem ? el("span", { class: "danger" }, queue.problem) : "");
  const styles = queue.bands.map((_, index) => bandStyle(index, queue.bands.length));
  parts.tbody.replaceChildren(...queue.bands.map((band, index) => {
    const swatch = el("span", { class: "swatch", "data-color": styles[index].color });
    swatch.style.background = styles[index].color;
    return el("tr", { "data-band": band.band },
      el("td", { class: "band" }, swatch, band.band),
      el("td", { class: "ready" }, count(band.ready)),
      el("td", { class: "unacked" }, count(band.unacked)),
      el("td", { class: "consumers" }, count(band.consumers)),
      el("td", { class: "oldest" }, age(band.oldest_ready_age_seconds)),
      el("td", { class: "wait", "data-source": band.wait_source || "",
        title: WAIT_TITLES[band.wait_source] || "not known" }, waitText(band)),
      el("td", { class: "p50" }, age(band.wait_p50_seconds)),
      el("td", { class: "p99" }, age(band.wait_p99_seconds)),
      el("td", { class: "in" }, rate(band.publish_rate)),
      el("td", { class: "out" }, rate(band.deliver_rate)));
  }));
  drawChart(parts.chart, queue, windowSeconds, styles);
  drawLegend(parts.legend, queue, styles);
}

function drawLegend(legend, queue, styles) {
  legend.replaceChildren(...queue.bands.map((band, index) => {
    const sample = svg("svg", { class: "legend-swatch", width: "30", height: "10", viewBox: "0 0 30 10" });
    sample.append(svg("line", { x1: "1", y1: "5", x2: "29", y2: "5", ...strokeAttrs(styles[index]) }));
    return el("span", { class: "legend-item", "data-band": band.band }, sample, band.band);
  }));
}

function drawChart(chart, queue, windowSeconds, styles) {
  const [left, top, width, height] = [44, 10, 346, 118];
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
  nodes.push(label("wait per band", { x: left + 6, y: top + 8 }));
  // Hottest first, so the colder (narrower, dashed) lines lie on top of it.
  queue.bands.forEach((band, index) => {
    const points = (queue.chart[band.band] || []).filter(([, wait]) => wait !== null)
      .map(([ago, wait]) => x(ago).toFixed(1) + "," + y(wait).toFixed(1));
    if (points.length) {
      nodes.push(svg("polyline", { points: points.join(" "), fill: "none",
        ...strokeAttrs(styles[index]), "data-band": band.band }));
      // The latest sample as a dot: a line of one sample (a backlog just found) shows too.
      const [cx, cy] = points[points.length - 1].split(",");
      nodes.push(svg("circle", { cx, cy, r: String(styles[index].width), fill: styles[index].color,
        class: "latest", "data-band": band.band }));
    }
  });
  chart.replaceChildren(...nodes);
}

// Cancel, replace and escalate one message by id: the API's own routes, with the token the
// operator pasted (they need publish:<queue>), their answers and errors shown as they come.
function buildMessageActions(name, bands) {
  const id = el("input", { class: "message-id", placeholder: "message id", size: "22" });
  const body = el("textarea", { class: "message-body", rows: "3", cols: "48",
    spellcheck: "false", placeholder: '{"payload": {...}, "priority": 7}' });
  const cancel = el("button", { type: "button", class: "cancel-message" }, "Cancel message");
  const replace = el("button", { type: "button", class: "replace-message" }, "Replace");
  const target = el("select", { class: "escalate-to" },
    ...bands.map((band) => el("option", { value: "band:" + band }, "band " + band)),
    ...[9, 8, 7, 6, 5, 4, 3, 2, 1, 0].map((n) => el("option", { value: "priority:" + n }, "priority " + n)));
  const escalate = el("button", { type: "button", class: "escalate-message" }, "Escalate");
  const result = el("p", { class: "message-result", role: "status" });
  const note = el("p", { class: "message-note muted" });
  // status: the HTTP status; 0 for a refusal in the page itself; null while a request runs.
  const show = (text, status, code, extra) => {
    result.textContent = text;
    if (status === null) delete result.dataset.status;
    else result.dataset.status = String(status);
    result.dataset.code = code || "";
    result.classList.toggle("danger", status !== null && (status === 0 || status >= 400));
    note.textContent = extra || "";
  };
  const parsedBody = () => {
    let data;
    try { data = JSON.parse(body.value); } catch (error) {
      show("the message body is not JSON: " + error.message, 0, "not_json");
      return null;
    }
    if (data === null || typeof data !== "object" || Array.isArray(data)) {
      show('the message body must be a JSON object, e.g. {"payload": {...}}', 0, "not_an_object");
      return null;
    }
    return data;
  };
  const act = async (what, method, suffix, data) => {
    const messageId = id.value.trim();
    if (!messageId) { show("type the message id first", 0, "missing_id"); return; }
    for (const button of [cancel, replace, escalate]) button.disabled = true;
    show(method + " " + messageId + "…", null, "");
    try {
      const path = "/v1/queues/" + encodeURIComponent(name) + "/messages/" +
        encodeURIComponent(messageId) + suffix;
      const response = await api(method, path, data);
      const answer = await response.json();
      if (method === "DELETE") {
        show("cancelled " + answer.message_id + ": copies published before generation " +
          answer.cancelled_before + " will not run (" + response.status + ")",
          response.status, "", answer.note);
      } else {
        show(what + " " + answer.message_id + ": now priority " + answer.priority + " in band " +
          answer.band + ", generation " + answer.generation + " (" + response.status + ")",
          response.status, "");
      }
    } catch (error) {
      const why = error.status ? error.status + " " + (error.code || "error") : "no answer";
      show("refused: " + why + ": " + error.message, error.status || 0, error.code);
    } finally {
      for (const button of [cancel, replace, escalate]) button.disabled = false;
    }
  };
  cancel.addEventListener("click", () => act("cancelled", "DELETE", "", undefined));
  replace.addEventListener("click", () => {
    const data = parsedBody();
    if (data) act("replaced", "PUT", "", data);
  });
  escalate.addEventListener("click", () => {
    const data = parsedBody();
    if (!data) return;
    const [kind, ...rest] = target.value.split(":");
    const value = rest.join(":");
    delete data.priority;
    delete data.band;
    data[kind] = kind === "priority" ? Number(value) : value;
    act("escalated", "POST", "/escalate", data);
  });
  return el("div", { class: "message-actions" }, el("h3", {}, "One message by id"),
    el("div", { class: "controls" }, el("label", {}, "id ", id), cancel),
    el("div", { class: "controls" },
      el("label", { class: "stacked" }, "message body (JSON) for replace and escalate", body),
      el("div", { class: "buttons" }, replace, el("span", {}, target, " ", escalate))),
    result, note);
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

function drawDeployment(data) {
  const deployment = document.getElementById("deployment");
  deployment.replaceChildren("delayed ", el("b", { class: "delayed" }, count(data.delayed)),
    " (all queues: the delay ladder is shared, so no queue's own count is known)");
  deployment.hidden = false;
}

function clearQueues() {
  built.clear();
  document.getElementById("queues").replaceChildren();
  document.getElementById("deployment").hidden = true;
  document.getElementById("whoami").textContent = "";
}

function refusal(error) {
  if (error.status !== 401) return error.message;
  if (error.code === "invalid_token") {
    return "invalid token: the gateway does not accept this token (401 invalid_token); " +
      "paste another";
  }
  return "paste a token with read:<queue> or admin";
}

async function poll() {
  if (stopped) return;
  try {
    const data = await (await api("GET", "/v1/console/overview")).json();
    notice(data.management ? "" : "no management URL: unacked, rates and estimated waits are unknown");
    document.getElementById("whoami").textContent = "token: " + data.token;
    drawDeployment(data);
    for (const queue of data.queues) {
      if (!built.has(queue.queue)) buildQueue(queue, data.admin);
      drawQueue(queue, data.window_seconds);
    }
    delete document.body.dataset.refused;
    delete document.body.dataset.code;
    document.body.dataset.loaded = "true";
  } catch (error) {
    notice(refusal(error));
    document.body.dataset.refused = String(error.status || "error");
    document.body.dataset.code = error.code || "";
    if (error.status === 401 || error.status === 403) clearQueues();
    // Asking again with the same token only counts failures against this address.
    if (error.status === 401) stopped = true;
  }
}

function start() {
  document.getElementById("login").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value.trim());
    document.getElementById("token").value = "";
    clearQueues();
    delete document.body.dataset.refused;
    delete document.body.dataset.loaded;
    stopped = false;
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
