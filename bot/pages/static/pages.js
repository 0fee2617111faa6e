// The incident page's table and its following: one page of rows at a time from the bot (sorted and filtered by
// its store), and the incident's summary fetched again when the incident changes. Every value is set as text
// (textContent), never as HTML: a label that holds markup stays text.
"use strict";

(function () {
  const root = document.getElementById("incident");
  if (!root) {
    document.body.dataset.ready = "1";
    return;
  }
  const base = root.dataset.base;
  const refresh = Number(root.dataset.refresh) || 5000;
  const form = document.getElementById("filters");
  const rows = document.getElementById("rows");
  const count = document.getElementById("count");
  const pageInfo = document.getElementById("pageinfo");
  const previous = document.getElementById("previous");
  const next = document.getElementById("next");
  const FILTERS = ["host", "alertname", "gpu", "status", "acked", "label"];
  const state = { sort: "value", order: "desc", page: 1, filters: {} };
  let stamp = root.dataset.stamp;
  let lastPage = 1;

  function readLocation() {
    const params = new URLSearchParams(window.location.search);
    state.sort = params.get("sort") || state.sort;
    state.order = params.get("order") === "asc" ? "asc" : "desc";
    state.page = Math.max(1, Number(params.get("page")) || 1);
    for (const name of FILTERS) {
      const value = params.get(name);
      if (value) state.filters[name] = value;
    }
    for (const name of FILTERS) {
      const field = form.elements.namedItem(name);
      if (field) field.value = state.filters[name] || "";
    }
  }

  function query() {
    const params = new URLSearchParams({ sort: state.sort, order: state.order, page: String(state.page) });
    for (const [name, value] of Object.entries(state.filters)) {
      if (value) params.set(name, value);
    }
    return params;
  }

  function cell(text, className) {
    const td = document.createElement("td");
    td.textContent = text;
    if (className) td.className = className;
    return td;
  }

  function alertLink(row) {
    const td = document.createElement("td");
    const a = document.createElement("a");
    a.href = "/pages/alerts/" + encodeURIComponent(row.id);
    a.textContent = row.id;
    td.appendChild(a);
    return td;
  }

  function labelsText(labels) {
    return Object.entries(labels)
      .map(([name, value]) => name + "=" + value)
      .join(" ");
  }

  function show(answer) {
    const body = document.createDocumentFragment();
    for (const row of answer.rows) {
      const tr = document.createElement("tr");
      tr.className = row.status;
      tr.append(
        alertLink(row),
        cell(row.host, "host"),
        cell(row.gpu, "gpu"),
        cell(row.alertname, "alertname"),
        cell(row.status, "status"),
        cell(row.value_text, "value"),
        cell(row.started, "started"),
        cell(row.acked_by || "", "acked"),
        cell(labelsText(row.labels), "labels")
      );
      body.appendChild(tr);
    }
    rows.replaceChildren(body);
    lastPage = Math.max(1, Math.ceil(answer.matching / answer.per_page));
    const first = answer.matching ? (answer.page - 1) * answer.per_page + 1 : 0;
    const last = (answer.page - 1) * answer.per_page + answer.rows.length;
    count.textContent =
      answer.matching === answer.total
        ? `Alerts ${first} to ${last} of ${answer.total}`
        : `Alerts ${first} to ${last} of ${answer.matching} matching (${answer.total} in all)`;
    pageInfo.textContent = `page ${answer.page} of ${lastPage}`;
    previous.disabled = answer.page <= 1;
    next.disabled = answer.page >= lastPage;
    for (const button of document.querySelectorAll("th button[data-sort]")) {
      const sorted = button.dataset.sort === state.sort;
      button.parentElement.setAttribute("aria-sort", sorted ? (state.order === "asc" ? "ascending" : "descending") : "none");
    }
  }

  // The pictures come after the table: drawing one must not hold up the rows people came for.
  function showPictures() {
    for (const img of document.querySelectorAll("img[data-src]")) {
      img.src = img.dataset.src;
      img.removeAttribute("data-src");
    }
  }

  function problem(text) {
    count.textContent = text;
    count.classList.add("problem");
  }

  async function loadRows() {
    const params = query();
    window.history.replaceState(null, "", "?" + params.toString());
    const answer = await fetch(base + "/alerts?" + params.toString(), { credentials: "same-origin" });
    const body = await answer.json();
    if (!answer.ok) {
      problem(body.message || "The alerts could not be read.");
      return;
    }
    count.classList.remove("problem");
    show(body);
    document.body.dataset.ready = "1";
    showPictures();
  }

  async function follow() {
    try {
      const answer = await fetch(base + "/version", { credentials: "same-origin" });
      if (!answer.ok) return;
      const head = await answer.json();
      if (head.stamp === stamp) return;
      stamp = head.stamp;
      const summary = await fetch(base + "/summary", { credentials: "same-origin" });
      if (summary.ok) {
        document.getElementById("summary").innerHTML = await summary.text();
      }
      await loadRows();
      root.dataset.stamp = stamp;
    } catch (error) {
      // The bot restarting or the network gone: the next tick tries again.
    }
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    state.filters = {};
    for (const name of FILTERS) {
      const field = form.elements.namedItem(name);
      if (field && field.value.trim()) state.filters[name] = field.value.trim();
    }
    state.page = 1;
    loadRows();
  });
  form.addEventListener("reset", () => {
    state.filters = {};
    state.page = 1;
    window.setTimeout(loadRows, 0);
  });
  for (const button of document.querySelectorAll("th button[data-sort]")) {
    button.addEventListener("click", () => {
      const key = button.dataset.sort;
      state.order = state.sort === key && state.order === "asc" ? "desc" : "asc";
      state.sort = key;
      state.page = 1;
      loadRows();
    });
  }
  document.getElementById("summary").addEventListener("click", (event) => {
    const target = event.target.closest("a[data-filter-label]");
    if (!target) return;
    event.preventDefault();
    state.filters = { label: target.dataset.filterLabel };
    form.elements.namedItem("label").value = state.filters.label;
    state.page = 1;
    loadRows();
    document.getElementById("alerts").scrollIntoView();
  });
  previous.addEventListener("click", () => {
    state.page = Math.max(1, state.page - 1);
    loadRows();
  });
  next.addEventListener("click", () => {
    state.page = Math.min(lastPage, state.page + 1);
    loadRows();
  });

  readLocation();
  loadRows();
  window.setInterval(follow, refresh);
})();
