// agentflows console: live updates. Served by the console itself; the page's
// Content-Security-Policy allows no other script. Everything received is written
// with textContent (never innerHTML), so text from a run can never become markup.
"use strict";

const PHASES = new Set(["Pending", "Queued", "Running", "Waiting", "Succeeded", "Failed", "Cancelled", "Skipped"]);
const COLUMNS = ["name", "namespace", "flow", "phase", "trigger", "started", "duration", "pending", "cost"];

function phaseBadge(phase) {
  const badge = document.createElement("span");
  badge.className = PHASES.has(phase) ? "phase phase-" + phase : "phase";
  badge.textContent = phase;
  return badge;
}

function setPhase(cell, phase) {
  if (!cell) return;
  const old = cell.querySelector(".phase");
  if (old && old.textContent === phase) return;
  cell.replaceChildren(phaseBadge(phase));
}

function safeHref(href) {
  // only this console's own paths
  return typeof href === "string" && href.startsWith("/") && !href.startsWith("//") ? href : "#";
}

let rowsByKey = null;

function rowOf(table, key) {
  // an index of the rows, so a thousand updates on connect cost a thousand look-ups
  if (rowsByKey === null) {
    rowsByKey = new Map(Array.from(table.tBodies[0].rows, (r) => [r.dataset.key, r]));
  }
  return rowsByKey.get(key);
}

function upsertRow(table, row) {
  let tr = rowOf(table, row.key);
  if (!tr) {
    tr = document.createElement("tr");
    tr.dataset.key = row.key;
    for (const field of COLUMNS) {
      const td = document.createElement("td");
      td.dataset.field = field;
      tr.appendChild(td);
    }
    table.tBodies[0].prepend(tr);
    rowsByKey.set(row.key, tr);
  }
  for (const field of COLUMNS) {
    const td = tr.querySelector('td[data-field="' + field + '"]');
    if (field === "phase") {
      setPhase(td, row.phase);
    } else if (field === "name") {
      const link = document.createElement("a");
      link.href = safeHref(row.href);
      link.textContent = row.name;
      if (td.textContent !== row.name) td.replaceChildren(link);
    } else if (td.textContent !== row[field]) {
      td.textContent = row[field];
    }
  }
}

function updateCount(table) {
  const count = document.getElementById("count");
  if (count) count.textContent = table.tBodies[0].rows.length + " run(s)";
}

function onRuns(message) {
  const table = document.getElementById("runs");
  if (!table) return;
  if (message.type === "upsert") {
    upsertRow(table, message.row);
  } else if (message.type === "delete") {
    const tr = rowOf(table, message.key);
    if (tr) {
      tr.remove();
      rowsByKey.delete(message.key);
    }
  }
  updateCount(table);
}

function phasesShown() {
  const shown = {};
  for (const item of document.querySelectorAll("#graph [data-node]")) {
    const badge = item.querySelector('[data-field="phase"]');
    shown[item.dataset.node] = badge ? badge.textContent : "";
  }
  return shown;
}

function redrawPicture() {
  // the server draws the run again (Graphviz); an SVG in <img> never runs anything
  const picture = document.getElementById("picture");
  if (picture) picture.src = picture.src.split("?")[0] + "?at=" + Date.now();
}

function onRun(message) {
  if (message.type !== "run") return;
  const before = JSON.stringify(phasesShown());
  setPhase(document.querySelector('[data-field="run-phase"]'), message.phase);
  for (const [node, state] of Object.entries(message.nodes)) {
    for (const element of document.querySelectorAll("[data-node]")) {
      if (element.dataset.node !== node) continue;
      setPhase(element.querySelector('[data-field="phase"]'), state.phase);
      const duration = element.querySelector('[data-field="duration"]');
      if (duration) duration.textContent = state.duration;
    }
  }
  if (JSON.stringify(phasesShown()) !== before) redrawPicture();
}

function showError(main, text) {
  let box = document.getElementById("live-error");
  if (!box) {
    box = document.createElement("p");
    box.id = "live-error";
    box.className = "notice error";
    main.prepend(box);
  }
  box.textContent = "Live updates stopped: " + text;
}

function textOf(section, node) {
  // one block per node; parallel nodes each write their own
  for (const pre of section.querySelectorAll("pre[data-stream-node]")) {
    if (pre.dataset.streamNode === node) return pre;
  }
  const heading = document.createElement("h3");
  heading.textContent = node;
  const pre = document.createElement("pre");
  pre.className = "live-text";
  pre.dataset.streamNode = node;
  const idle = section.querySelector("p.muted");
  if (idle) idle.remove();
  section.append(heading, pre);
  return pre;
}

function onText(section, message) {
  const pre = textOf(section, String(message.node));
  if (message.restart) {
    pre.textContent = "";
  } else if (typeof message.delta === "string") {
    pre.append(message.delta);
  } else if (message.end) {
    pre.dataset.ended = "true";
  }
}

function followText() {
  // agents' answers as the model writes them, read from the runner pod's log by the server
  const section = document.querySelector("[data-live-text]");
  if (!section) return;
  const source = new EventSource(section.dataset.liveText);
  source.onmessage = (event) => {
    const message = JSON.parse(event.data);
    if (message.type === "error") {
      section.append(Object.assign(document.createElement("p"), {
        className: "notice error", textContent: "Live text unavailable: " + message.message,
      }));
      source.close();
    } else if (message.type === "end") {
      section.dataset.ended = "true";
      source.close(); // the run has ended or waits; connecting again would replay the log
    } else {
      onText(section, message);
    }
  };
}

function follow() {
  const main = document.querySelector("main[data-live]");
  if (!main) return;
  const source = new EventSource(main.dataset.live);
  const handle = main.dataset.live.startsWith("/events/runs") ? onRuns : onRun;
  source.onmessage = (event) => {
    const message = JSON.parse(event.data);
    if (message.type === "error") {
      showError(main, message.message);
      source.close();
      return;
    }
    handle(message);
  };
}

document.addEventListener("DOMContentLoaded", follow);
document.addEventListener("DOMContentLoaded", followText);
