// The tenants page: a page of tenants at a time from /dashboard/api/tenants (paged by name, filtered by a
// name prefix and a state), with suspend / resume and a quota editor. Plain DOM, no framework, no CDN.
"use strict";

const POLL_MS = 5000;
const QUOTAS = ["max_memories", "max_datasources", "requests_per_minute", "embedding_texts_per_day"];
// `asked` numbers each load: an answer to an older one (a filter typed since, another page) is dropped.
const view = { cursors: [null], page: 0, next: null, asked: 0 };

function num(value) {
  return el("td", { class: value === 0 ? "num zero" : "num" }, value.toLocaleString());
}

function bytes(value) {
  const units = ["B", "KB", "MB", "GB", "TB"];
  let size = value;
  let unit = 0;
  while (size >= 1024 && unit < units.length - 1) { size /= 1024; unit += 1; }
  return el("td", { class: value === 0 ? "num zero" : "num" }, `${unit === 0 ? size : size.toFixed(1)} ${units[unit]}`);
}

function patchTenant(name, change) {
  return call(`/dashboard/api/tenants/${encodeURIComponent(name)}`, {
    method: "PATCH",
    headers: { "Content-Type": "application/json", "X-Engram-Dashboard": "1" },
    body: JSON.stringify(change),
  });
}

function quotaText(quotas) {
  const set = QUOTAS.filter((name) => quotas[name] !== null).map((name) => `${name} ${quotas[name].toLocaleString()}`);
  return set.length ? set.join(", ") : "unlimited";
}

function coverageCell(ratio) {
  const pct = Math.round((ratio ?? 1) * 100);
  const bar = el("span", { class: pct < 100 ? "bar partial" : "bar" }, el("span", { style: `width:${pct}%` }));
  return el("td", {}, bar, ` ${pct}%`);
}

function openEditor(tenant) {
  const dialog = document.getElementById("quota-editor");
  const form = document.getElementById("quota-form");
  document.getElementById("quota-tenant").textContent = tenant.tenant;
  document.getElementById("quota-error").textContent = "";
  for (const name of QUOTAS) form.elements[name].value = tenant.quotas[name] ?? "";
  dialog.dataset.tenant = tenant.tenant;
  dialog.showModal();
}

async function saveQuotas(event) {
  const dialog = document.getElementById("quota-editor");
  if (event.submitter?.value !== "save") return;
  event.preventDefault();
  const form = document.getElementById("quota-form");
  const quotas = {};
  for (const name of QUOTAS) {
    const raw = form.elements[name].value.trim();
    quotas[name] = raw === "" ? null : Number(raw);
  }
  try {
    await patchTenant(dialog.dataset.tenant, { quotas });
    dialog.close();
    await load();
  } catch (error) {
    document.getElementById("quota-error").textContent = error.message;
  }
}

function row(tenant) {
  const u = tenant.usage;
  const suspended = tenant.state === "suspended";
  const toggle = el("button", {
    type: "button",
    class: suspended ? "" : "secondary",
    onclick: async () => {
      toggle.disabled = true;
      try { await patchTenant(tenant.tenant, { state: suspended ? "active" : "suspended" }); await load(); }
      catch (error) { document.getElementById("tenants-error").textContent = error.message; toggle.disabled = false; }
    },
  }, suspended ? "Resume" : "Suspend");
  const edit = el("button", { type: "button", class: "secondary", onclick: () => openEditor(tenant) }, "Quotas");
  const backlog = tenant.backlog ?? { queued: 0, running: 0 };
  return el("tr", { "data-tenant": tenant.tenant },
    el("td", { class: "id" }, tenant.tenant),
    el("td", {}, el("span", { class: `state state-${suspended ? "failed" : "succeeded"}` }, tenant.state)),
    num(u.memories), num(u.datasources), bytes(u.storage_bytes), num(u.requests), num(u.searches), num(u.saves),
    num(u.embedded_texts), num(backlog.queued + backlog.running), coverageCell(tenant.coverage),
    el("td", { class: "muted" }, quotaText(tenant.quotas)),
    el("td", { class: "actions" }, toggle, " ", edit),
  );
}

function query() {
  const form = document.getElementById("tenant-filters");
  const params = new URLSearchParams({ limit: "50" });
  for (const name of ["q", "state"]) if (form.elements[name].value) params.set(name, form.elements[name].value);
  const cursor = view.cursors[view.page];
  if (cursor) params.set("cursor", cursor);
  return params;
}

async function load() {
  const status = document.getElementById("status");
  const asked = ++view.asked;
  try {
    const body = await call(`/dashboard/api/tenants?${query()}`);
    if (asked !== view.asked) return;
    document.querySelector("#tenants tbody").replaceChildren(...body.tenants.map(row));
    document.getElementById("no-tenants").hidden = body.tenants.length > 0;
    view.next = body.next_cursor;
    document.getElementById("tenants-next").disabled = !view.next;
    document.getElementById("tenants-prev").disabled = view.page === 0;
    document.getElementById("tenants-page").textContent = `page ${view.page + 1}`;
    const counts = body.counts ?? {};
    document.getElementById("tenant-counts").replaceChildren(
      ...["active", "suspended", "deleting"].map((state) =>
        el("div", { class: "total" }, el("b", {}, (counts[state] ?? 0).toLocaleString()), state === "deleting" ? "offboarding" : state)),
    );
    document.getElementById("tenants-error").textContent = "";
    status.textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    status.textContent = `error: ${error.message}`;
  }
}

function restart() {
  view.cursors = [null];
  view.page = 0;
  load();
}

document.getElementById("tenant-filters").addEventListener("input", restart);
document.getElementById("tenant-filters").addEventListener("submit", (event) => { event.preventDefault(); restart(); });
document.getElementById("tenants-next").addEventListener("click", () => {
  if (!view.next) return;
  view.cursors[view.page + 1] = view.next;
  view.page += 1;
  load();
});
document.getElementById("tenants-prev").addEventListener("click", () => {
  if (view.page === 0) return;
  view.page -= 1;
  load();
});
document.getElementById("quota-form").addEventListener("submit", saveQuotas);
load();
setInterval(() => { if (!document.getElementById("quota-editor").open) load(); }, POLL_MS);
