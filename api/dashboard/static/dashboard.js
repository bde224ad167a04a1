// The operators' page: polls /dashboard/api/summary and renders it. Plain DOM, no framework, no CDN.
"use strict";

const POLL_MS = 3000;
const retried = new Map(); // job id -> last known job, for jobs retried from this page

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value);
  }
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

function num(value, hotWhenPositive = false) {
  const cls = value === 0 ? "num zero" : hotWhenPositive ? "num hot" : "num";
  return el("td", { class: cls }, value);
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 60) return `${Math.round(seconds)} s`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

function when(iso) {
  return iso ? new Date(iso).toLocaleTimeString() : "–";
}

function stateBadge(state) {
  return el("span", { class: `state state-${state}` }, state);
}

function fill(tableId, rows) {
  const body = document.querySelector(`#${tableId} tbody`);
  body.replaceChildren(...rows);
}

async function call(url, options = {}) {
  const response = await fetch(url, { credentials: "same-origin", cache: "no-store", ...options });
  if (response.status === 401) {
    window.location.reload(); // the session ended: the page answers with the sign-in form
    throw new Error("signed out");
  }
  const body = await response.json();
  if (!response.ok) throw new Error(body.error ? body.error.message : `HTTP ${response.status}`);
  return body;
}

async function retry(jobId, button) {
  button.disabled = true;
  try {
    const job = await call(`/dashboard/api/jobs/${encodeURIComponent(jobId)}/retry`, {
      method: "POST",
      headers: { "X-Engram-Dashboard": "1" },
    });
    retried.set(job.id, job);
    renderRetries();
    refresh();
  } catch (error) {
    button.disabled = false;
    document.getElementById("status").textContent = `retry failed: ${error.message}`;
  }
}

function renderTotals(queues) {
  const sum = (key) => queues.reduce((total, row) => total + (row[key] || 0), 0);
  const oldest = Math.max(-1, ...queues.map((row) => row.oldest_queued_age_seconds ?? -1));
  const boxes = [
    ["Queued", sum("queued")], ["Running", sum("running")], ["Failed", sum("failed")],
    ["Done last hour", sum("succeeded_last_hour")], ["Oldest queued", oldest < 0 ? "–" : age(oldest)],
  ];
  document.getElementById("totals").replaceChildren(
    ...boxes.map(([label, value]) => el("div", { class: "total" }, el("b", {}, value), label)));
}

function renderQueues(queues) {
  fill("queues", queues.map((row) => el("tr", {},
    el("td", {}, row.tenant ?? "(system)"), el("td", {}, row.kind),
    num(row.queued), num(row.running), num(row.succeeded), num(row.failed, true),
    num(row.succeeded_last_hour), num(row.failed_last_hour, true),
    el("td", { class: "num" }, age(row.oldest_queued_age_seconds)))));
}

function renderFailed(failed) {
  fill("failed", failed.map((job) => el("tr", { "data-job-id": job.id },
    el("td", {}, job.tenant ?? "(system)"), el("td", {}, job.kind), el("td", { class: "id" }, job.id),
    num(job.attempts), el("td", { class: "error" }, job.error ?? ""), el("td", {}, when(job.finished_at)),
    el("td", {}, el("button", { type: "button", class: "retry", onclick: (event) => retry(job.id, event.target) },
      "Retry")))));
  document.getElementById("no-failures").hidden = failed.length > 0;
}

function renderRetries() {
  const section = document.getElementById("retries-section");
  section.hidden = retried.size === 0;
  fill("retries", [...retried.values()].map((job) => el("tr", { "data-job-id": job.id },
    el("td", { class: "id" }, job.id), el("td", {}, job.kind), el("td", {}, stateBadge(job.state)),
    num(job.attempts), el("td", { class: "error" }, job.error ?? ""))));
}

function renderCoverage(coverage) {
  fill("coverage", coverage.map((row) => {
    const pct = Math.round(row.ratio * 1000) / 10;
    const bar = el("span", { class: row.ratio < 1 ? "bar partial" : "bar" }, el("span", { style: `width:${pct}%` }));
    return el("tr", {}, el("td", {}, row.tenant), el("td", {}, row.doc_kind), el("td", { class: "id" }, row.model),
      num(row.indexed), num(row.expected), el("td", {}, bar, ` ${pct}%`));
  }));
}

function renderRecent(recent) {
  fill("recent", recent.map((job) => el("tr", {},
    el("td", {}, job.tenant ?? "(system)"), el("td", {}, job.kind), el("td", { class: "id" }, job.id),
    el("td", {}, stateBadge(job.state)), num(job.attempts), el("td", {}, when(job.updated_at)))));
}

async function refreshRetried() {
  for (const id of retried.keys()) {
    const job = retried.get(id);
    if (job.state === "succeeded") continue;
    retried.set(id, await call(`/dashboard/api/jobs/${encodeURIComponent(id)}`));
  }
  renderRetries();
}

let timer = null;
async function refresh() {
  clearTimeout(timer);
  try {
    const summary = await call("/dashboard/api/summary");
    renderTotals(summary.queues);
    renderQueues(summary.queues);
    renderFailed(summary.failed);
    renderCoverage(summary.coverage);
    renderRecent(summary.recent);
    await refreshRetried();
    document.getElementById("status").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    document.getElementById("status").textContent = `update failed: ${error.message}`;
  } finally {
    timer = setTimeout(refresh, POLL_MS);
  }
}

refresh();
