// The operators' page: polls the dashboard's JSON (summary, workers, throughput, the job list) and renders
// it; a job id opens that job's detail (#job=<id>, so it can be linked). Plain DOM, no framework, no CDN.
"use strict";

const POLL_MS = 3000;
const CHART_EVERY = 10; // polls between chart reloads: hourly buckets change slowly
const retried = new Map(); // job id -> last known job, for jobs retried from this page
const jobsView = { cursors: [null], page: 0, next: null }; // cursors[i] opens page i of the job list
let polls = 0;

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

function whenFull(iso) {
  return iso ? new Date(iso).toLocaleString() : "–";
}

function jobLink(id) {
  return el("a", { href: `#job=${encodeURIComponent(id)}`, class: "id" }, id);
}

function tenantName(name) {
  return name ?? "(system)";
}

function stateBadge(state) {
  return el("span", { class: `state state-${state}` }, state);
}

function fill(tableId, rows) {
  const body = document.querySelector(`#${tableId} tbody`);
  body.replaceChildren(...rows);
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
    if (currentJobId() === job.id) openDetail(job.id);
  } catch (error) {
    button.disabled = false;
    document.getElementById("status").textContent = `retry failed: ${error.message}`;
  }
}

// Operator actions beyond a retry: each asks for a reason (kept on the job with "dashboard" as who).
const CHANGES = { method: "POST", headers: { "X-Engram-Dashboard": "1", "Content-Type": "application/json" } };

async function abandon(jobId, action, button) {
  const reason = window.prompt(`Why ${action} job ${jobId}?`);
  if (!reason) return;
  button.disabled = true;
  try {
    await call(`/dashboard/api/jobs/${encodeURIComponent(jobId)}/${action}`,
      { ...CHANGES, body: JSON.stringify({ reason }) });
    refresh();
    if (currentJobId() === jobId) openDetail(jobId);
  } catch (error) {
    document.getElementById("status").textContent = `${action} failed: ${error.message}`;
  } finally {
    button.disabled = false;
  }
}

function chosenFilter() {
  const form = document.getElementById("job-filters");
  const filter = {};
  for (const name of ["tenant", "kind"]) if (form.elements[name].value) filter[name] = form.elements[name].value;
  return filter;
}

async function bulk(action, button) {
  const filter = chosenFilter();
  const scope = Object.keys(filter).length ? JSON.stringify(filter) : "every tenant and kind";
  const body = { ...filter };
  if (action === "discard") {
    const reason = window.prompt(`Why discard the failed jobs of ${scope}?`);
    if (!reason) return;
    body.reason = reason;
  } else if (!window.confirm(`Retry the failed jobs of ${scope}?`)) return;
  button.disabled = true;
  try {
    const answer = await call(`/dashboard/api/jobs:${action}`, { ...CHANGES, body: JSON.stringify(body) });
    document.getElementById("status").textContent = `${action}: ${answer.count} job(s)`;
    refresh();
  } catch (error) {
    document.getElementById("status").textContent = `${action} failed: ${error.message}`;
  } finally {
    button.disabled = false;
  }
}

document.getElementById("retry-all").addEventListener("click", (event) => bulk("retry", event.target));
document.getElementById("discard-all").addEventListener("click", (event) => bulk("discard", event.target));
document.getElementById("find-job").addEventListener("submit", (event) => {
  event.preventDefault();
  const id = event.target.elements.id.value.trim();
  if (id) window.location.hash = `job=${encodeURIComponent(id)}`;
});

function renderTotals(queues) {
  const sum = (key) => queues.reduce((total, row) => total + (row[key] || 0), 0);
  const oldest = Math.max(-1, ...queues.map((row) => row.oldest_queued_age_seconds ?? -1));
  const boxes = [
    ["Queued", sum("queued")], ["Running", sum("running")], ["Failed", sum("failed")],
    ["Done last hour", sum("succeeded_last_hour")], ["Oldest queued", oldest < 0 ? "–" : age(oldest)],
    ["Retry wait", sum("retry_scheduled")],
  ];
  document.getElementById("totals").replaceChildren(
    ...boxes.map(([label, value]) => el("div", { class: "total" }, el("b", {}, value), label)));
}

function renderQueues(queues) {
  fill("queues", queues.map((row) => el("tr", {},
    el("td", {}, tenantName(row.tenant)), el("td", {}, row.kind),
    num(row.queued), num(row.retry_scheduled ?? 0), num(row.running), num(row.succeeded), num(row.failed, true),
    num(row.succeeded_last_hour), num(row.failed_last_hour, true),
    el("td", { class: "num" }, age(row.oldest_queued_age_seconds)))));
}

function renderFailed(failed) {
  fill("failed", failed.map((job) => el("tr", { "data-job-id": job.id },
    el("td", {}, tenantName(job.tenant)), el("td", {}, job.kind), el("td", {}, jobLink(job.id)),
    num(job.attempts), el("td", { class: "error" }, job.error ?? ""), el("td", {}, when(job.finished_at)),
    el("td", {}, el("button", { type: "button", class: "retry", onclick: (event) => retry(job.id, event.target) },
      "Retry"), " ", el("button", { type: "button", class: "secondary discard",
      onclick: (event) => abandon(job.id, "discard", event.target) }, "Discard")))));
  document.getElementById("no-failures").hidden = failed.length > 0;
}

function renderRetries() {
  const section = document.getElementById("retries-section");
  section.hidden = retried.size === 0;
  fill("retries", [...retried.values()].map((job) => el("tr", { "data-job-id": job.id },
    el("td", {}, jobLink(job.id)), el("td", {}, job.kind), el("td", {}, stateBadge(job.state)),
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
    el("td", {}, tenantName(job.tenant)), el("td", {}, job.kind), el("td", {}, jobLink(job.id)),
    el("td", {}, stateBadge(job.state)), num(job.attempts), el("td", {}, when(job.updated_at)))));
}

// Workers from Celery's answer over the broker; running jobs from their lease heartbeats in the database.
function renderWorkers(body) {
  const brokerError = document.getElementById("broker-error");
  brokerError.hidden = !body.broker_error;
  brokerError.textContent = body.broker_error ? `broker not reachable: ${body.broker_error}` : "";
  fill("workers", body.workers.map((worker) => el("tr", { "data-worker": worker.name },
    el("td", { class: "id" }, worker.name),
    el("td", {}, el("span", { class: `state ${worker.alive ? "state-succeeded" : "state-failed"}` },
      worker.alive ? "alive" : "silent")),
    el("td", { class: "num" }, `${age(worker.last_seen_age_seconds)} ago`),
    el("td", {}, ...(worker.jobs.length ? worker.jobs.flatMap((job, i) =>
      [i ? ", " : "", jobLink(job.id), ` ${job.kind}`]) : [el("span", { class: "muted" }, "idle")])))));
  document.getElementById("no-workers").hidden = body.workers.length > 0;
  fill("running", body.running.map((job) => el("tr", { "data-job-id": job.id },
    el("td", {}, jobLink(job.id)), el("td", {}, tenantName(job.tenant)), el("td", {}, job.kind),
    el("td", { class: "id" }, job.worker ?? "–"), num(job.attempts), el("td", {}, when(job.started_at)),
    el("td", { class: job.heartbeat_age_seconds > 20 ? "num hot" : "num" }, `${age(job.heartbeat_age_seconds)} ago`))));
  document.getElementById("no-running").hidden = body.running.length > 0;
}

function renderCharts(body) {
  const { drawStackedBars } = window.engramCharts;
  drawStackedBars(document.getElementById("chart-throughput"), body.buckets, [
    { key: "succeeded", label: "succeeded", cls: "ok" }, { key: "failed", label: "failed", cls: "bad" }]);
  drawStackedBars(document.getElementById("chart-failures"), body.buckets, [
    { key: "failed_attempts", label: "failed attempts", cls: "warn" }]);
}

// The job list: filters and pages (cursor-based: the API returns the cursor of the next, older page).
function setOptions(select, values) {
  const current = select.value;
  const wanted = ["", ...values];
  if ([...select.options].map((o) => o.value).join("\n") === wanted.join("\n")) return;
  select.replaceChildren(...wanted.map((value) => el("option", { value }, value || "any")));
  select.value = wanted.includes(current) ? current : "";
}

function renderFilterOptions(summary) {
  const form = document.getElementById("job-filters");
  setOptions(form.elements.tenant, summary.tenants);
  setOptions(form.elements.kind, summary.kinds);
  setOptions(form.elements.state, summary.states);
}

async function loadJobs() {
  const form = document.getElementById("job-filters");
  const params = new URLSearchParams({ limit: "20" });
  for (const name of ["tenant", "kind", "state"]) if (form.elements[name].value) params.set(name, form.elements[name].value);
  const cursor = jobsView.cursors[jobsView.page];
  if (cursor) params.set("cursor", cursor);
  const errorBox = document.getElementById("jobs-error");
  try {
    const body = await call(`/dashboard/api/jobs?${params}`);
    errorBox.textContent = "";
    jobsView.next = body.next_cursor;
    fill("jobs", body.jobs.map((job) => el("tr", { "data-job-id": job.id },
      el("td", {}, jobLink(job.id)), el("td", {}, tenantName(job.tenant)), el("td", {}, job.kind),
      el("td", {}, stateBadge(job.state)), num(job.attempts), el("td", {}, whenFull(job.created_at)),
      el("td", { class: "error" }, job.error ?? ""))));
    document.getElementById("no-jobs").hidden = body.jobs.length > 0;
  } catch (error) {
    errorBox.textContent = error.message;
  }
  document.getElementById("jobs-prev").disabled = jobsView.page === 0;
  document.getElementById("jobs-next").disabled = !jobsView.next;
  document.getElementById("jobs-page").textContent = `page ${jobsView.page + 1}`;
}

function resetJobs() {
  jobsView.cursors = [null];
  jobsView.page = 0;
  loadJobs();
}

document.getElementById("job-filters").addEventListener("change", resetJobs);
document.getElementById("job-filters").addEventListener("submit", (event) => event.preventDefault());
document.getElementById("jobs-next").addEventListener("click", () => {
  if (!jobsView.next) return;
  jobsView.cursors[jobsView.page + 1] = jobsView.next;
  jobsView.page += 1;
  loadJobs();
});
document.getElementById("jobs-prev").addEventListener("click", () => {
  jobsView.page = Math.max(0, jobsView.page - 1);
  loadJobs();
});

// One job's detail, opened from any job id (the URL's #job=<id>).
function currentJobId() {
  const match = /^#job=(.+)$/.exec(window.location.hash);
  return match ? decodeURIComponent(match[1]) : null;
}

function field(label, value) {
  return [el("dt", {}, label), el("dd", {}, value)];
}

async function openDetail(jobId) {
  const section = document.getElementById("job-detail");
  let job;
  try {
    job = await call(`/dashboard/api/jobs/${encodeURIComponent(jobId)}`);
  } catch (error) {
    section.hidden = false;
    document.getElementById("detail-id").textContent = jobId;
    document.getElementById("detail-fields").replaceChildren(...field("Error", error.message));
    for (const id of ["detail-attempts", "detail-payload", "detail-result"]) document.getElementById(id).replaceChildren();
    return;
  }
  section.hidden = false;
  section.dataset.jobId = job.id;
  section.dataset.state = job.state;
  document.getElementById("detail-id").textContent = job.id;
  const retryButton = document.getElementById("detail-retry");
  retryButton.hidden = job.state !== "failed";
  retryButton.disabled = false;
  retryButton.onclick = (event) => retry(job.id, event.target);
  const discardButton = document.getElementById("detail-discard");
  discardButton.hidden = job.state !== "failed" || Boolean(job.abandoned);
  discardButton.onclick = (event) => abandon(job.id, "discard", event.target);
  const cancelButton = document.getElementById("detail-cancel");
  cancelButton.hidden = job.state !== "queued";
  cancelButton.onclick = (event) => abandon(job.id, "cancel", event.target);
  const timings = [
    ["Created", whenFull(job.created_at)], ["Queued since", whenFull(job.queued_since)],
    ["Started", whenFull(job.started_at)], ["Finished", whenFull(job.finished_at)],
    ["Took", job.duration_seconds === null ? "–" : `${job.duration_seconds} s`],
    ["Next attempt", whenFull(job.next_attempt_at)], ["Updated", whenFull(job.updated_at)],
  ];
  document.getElementById("detail-fields").replaceChildren(
    ...field("State", stateBadge(job.state)), ...field("Kind", job.kind), ...field("Tenant", tenantName(job.tenant)),
    ...field("Attempts", String(job.attempts)),
    ...(job.state === "running" ? [...field("Worker", job.worker ?? "–"),
      ...field("Heartbeat", `${age(job.heartbeat_age_seconds)} ago`)] : []),
    ...timings.flatMap(([label, value]) => field(label, value)),
    ...(job.error ? field("Last error", el("span", { class: "error" }, job.error)) : []),
    ...(job.abandoned ? field(job.abandoned.from_state === "queued" ? "Cancelled" : "Discarded",
      `by ${job.abandoned.by} at ${whenFull(job.abandoned.at)}: ${job.abandoned.reason}`) : []));
  const attempts = job.attempt_errors || [];
  document.getElementById("detail-attempts").replaceChildren(...attempts.map((attempt) => el("li", {},
    el("div", {}, el("b", {}, `Attempt ${attempt.attempt}`), ` · ${whenFull(attempt.at)}`),
    el("div", { class: "error" }, attempt.error),
    ...(attempt.traceback ? [el("details", {}, el("summary", {}, "Traceback"), el("pre", {}, attempt.traceback))] : []))));
  document.getElementById("detail-no-attempts").hidden = attempts.length > 0;
  document.getElementById("detail-payload").textContent = JSON.stringify(job.payload ?? {}, null, 2);
  document.getElementById("detail-result").textContent = job.result ? JSON.stringify(job.result, null, 2) : "–";
}

function onHash() {
  const jobId = currentJobId();
  if (jobId) openDetail(jobId).then(() => document.getElementById("job-detail").scrollIntoView());
  else document.getElementById("job-detail").hidden = true;
}

window.addEventListener("hashchange", onHash);
document.getElementById("detail-close").addEventListener("click", () => {
  history.replaceState(null, "", window.location.pathname);
  document.getElementById("job-detail").hidden = true;
});

async function refreshRetried() {
  for (const id of retried.keys()) {
    const job = retried.get(id);
    if (job.state === "succeeded") continue;
    retried.set(id, await call(`/dashboard/api/jobs/${encodeURIComponent(id)}`));
  }
  renderRetries();
}

async function refreshWorkers() {
  try {
    renderWorkers(await call("/dashboard/api/workers"));
  } catch (error) {
    document.getElementById("broker-error").hidden = false;
    document.getElementById("broker-error").textContent = `workers: ${error.message}`;
  }
}

async function refreshCharts() {
  try {
    renderCharts(await call("/dashboard/api/throughput?hours=24"));
  } catch (error) {
    document.getElementById("status").textContent = `charts: ${error.message}`;
  }
}

async function refreshReindex() {
  try {
    const body = await call("/dashboard/api/reindex");
    document.getElementById("reindex-model").textContent = body.model;
    const boxes = [["State", body.state], ["Done", body.done], ["Remaining", body.remaining],
      ["Texts / s", body.rate_per_s], ["ETA", body.eta_seconds === null ? "–" : age(body.eta_seconds)]];
    document.getElementById("reindex-totals").replaceChildren(
      ...boxes.map(([label, value]) => el("div", { class: "total" }, el("b", {}, String(value)), label)));
    fill("reindex", body.tenants.slice(0, 50).map((row) => el("tr", {}, el("td", {}, tenantName(row.tenant)),
      num(row.done), num(row.remaining, true), el("td", {}, row.old_vectors ? "yes" : "no"))));
    const toggle = document.getElementById("reindex-toggle");
    toggle.hidden = body.state === "idle";
    toggle.textContent = body.state === "paused" ? "Resume" : "Pause";
    toggle.onclick = async () => {
      toggle.disabled = true;
      try {
        await call(`/dashboard/api/reindex:${body.state === "paused" ? "resume" : "pause"}`, { ...CHANGES, body: "{}" });
        refreshReindex();
      } finally {
        toggle.disabled = false;
      }
    };
  } catch (error) {
    document.getElementById("status").textContent = `reindex: ${error.message}`;
  }
}

let timer = null;
async function refresh() {
  clearTimeout(timer);
  // The workers' answer can take up to a second (a broadcast over the broker): it renders on its own.
  const side = [refreshWorkers(), loadJobs(), refreshReindex(),
    ...(polls % CHART_EVERY === 0 ? [refreshCharts()] : [])];
  polls += 1;
  try {
    const summary = await call("/dashboard/api/summary");
    renderTotals(summary.queues);
    renderQueues(summary.queues);
    renderFailed(summary.failed);
    renderCoverage(summary.coverage);
    renderRecent(summary.recent);
    renderFilterOptions(summary);
    await refreshRetried();
    const detail = document.getElementById("job-detail");
    // A job still moving is read again; a finished one stays put (an opened traceback stays open).
    const moving = ["queued", "running"].includes(detail.dataset.state);
    if (!detail.hidden && moving && detail.dataset.jobId === currentJobId()) openDetail(detail.dataset.jobId);
    document.getElementById("status").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    document.getElementById("status").textContent = `update failed: ${error.message}`;
  } finally {
    await Promise.allSettled(side);
    timer = setTimeout(refresh, POLL_MS);
  }
}

onHash();
refresh();
