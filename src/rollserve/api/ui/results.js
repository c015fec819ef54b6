// The results table: GET /v1/results/summaries, filtered and paged on the server
// (newest first; `before` cursors walk to older pages).
"use strict";

const FILTERS = {
  status: ["completed", "failed", "cancelled", "timed_out", "interrupted"],
  masked: ["true", "false"],
  failure_kind: ["none", "infra", "agent", "timeout"],
};

const Results = {
  section: null,
  filters: { data_source: "", status: "", masked: "", failure_kind: "" },
  limit: 25,
  cursors: [null], // `before` of each page visited; the last is the current page
  lastSeq: 0, // the server's newest seq (from the status stream)
  seenSeq: 0, // the newest seq when the page was last loaded
  loading: false,
  generation: 0, // of the latest load(): an older one's response is dropped
  sources: [],

  mount(section) {
    Results.section = section;
    const select = (name, options) => h("label", {}, name.replace("_", " "), " ",
      h("select", { id: `filter-${name}`, name, onchange: Results.onFilter },
        h("option", { value: "" }, "any"), options.map((o) => h("option", { value: o }, o))));
    section.replaceChildren(
      h("form", { id: "results-filters", class: "filters", onsubmit: (e) => e.preventDefault() },
        select("data_source", []), select("status", FILTERS.status),
        select("masked", FILTERS.masked), select("failure_kind", FILTERS.failure_kind),
        h("span", { id: "results-total", class: "muted" })),
      h("div", { id: "results-table" }),
      h("div", { class: "pager" },
        h("button", { id: "results-newer", type: "button", onclick: Results.newer }, "← newer"),
        h("span", { id: "results-page", class: "muted" }),
        h("button", { id: "results-older", type: "button", onclick: Results.older }, "older →")),
    );
  },

  // Filters come from the URL hash (#results?status=failed...), so a view can be linked.
  show(params) {
    for (const key of Object.keys(Results.filters)) {
      Results.filters[key] = params.get(key) || "";
      const input = document.getElementById(`filter-${key}`);
      if (key === "data_source") Results.addSource(Results.filters[key]);
      input.value = Results.filters[key];
    }
    Results.cursors = [null];
    return Results.load();
  },

  onFilter() {
    const params = new URLSearchParams();
    for (const key of Object.keys(Results.filters)) {
      const value = document.getElementById(`filter-${key}`).value;
      if (value) params.set(key, value);
    }
    const query = params.toString();
    window.location.hash = query ? `results?${query}` : "results";
  },

  addSource(name) {
    if (!name || Results.sources.includes(name)) return;
    Results.sources.push(name);
    document.getElementById("filter-data_source").append(h("option", { value: name }, name));
  },

  // From the live stream: the data sources to offer, and a refresh of the first page
  // when newer results were stored.
  onStatus(status) {
    for (const name of status.handlers) Results.addSource(name);
    Results.lastSeq = status.last_seq;
    if (!Results.section.hidden && Results.cursors.length === 1 && status.last_seq > Results.seenSeq
        && !Results.loading) Results.load();
  },

  // Loads the page the filters and cursors say; only the latest load draws (a refresh
  // still in flight when the filters change must not overwrite the new filter's page).
  async load() {
    const generation = ++Results.generation;
    Results.loading = true;
    Results.seenSeq = Results.lastSeq; // what the page will hold: reload when newer arrive
    const before = Results.cursors[Results.cursors.length - 1];
    try {
      const page = await apiGet("v1/results/summaries", { ...Results.filters, before, limit: Results.limit });
      if (generation === Results.generation) Results.render(page);
    } catch (error) {
      if (generation === Results.generation) {
        document.getElementById("results-table").replaceChildren(h("p", { class: "error" }, error.message));
      }
    } finally {
      if (generation === Results.generation) Results.loading = false;
    }
  },

  render(page) {
    Results.nextBefore = page.next_before;
    document.getElementById("results-total").textContent =
      `${fmt(page.total)}${page.total_capped ? "+" : ""} results match`;
    document.getElementById("results-page").textContent = `page ${Results.cursors.length}`;
    document.getElementById("results-newer").disabled = Results.cursors.length === 1;
    document.getElementById("results-older").disabled = page.next_before === null;
    for (const row of page.summaries) Results.addSource(row.data_source);
    const rows = page.summaries.map((r) => h("tr", {
      class: "result-row", dataset: { id: r.id, seq: r.seq },
      onclick: () => { window.location.hash = `rollout/${encodeURIComponent(r.id)}`; },
    },
    h("td", { class: "num" }, fmt(r.seq)),
    h("td", {}, h("a", { href: `#rollout/${encodeURIComponent(r.id)}` }, r.id)),
    h("td", { class: "data-source" }, r.data_source),
    h("td", { class: `status st-${r.status}` }, r.status),
    h("td", { class: "num reward" }, fixed(r.reward, 3)),
    h("td", { class: "masked" }, r.masked ? "masked" : ""),
    h("td", { class: "failure-kind" }, r.failure_kind || ""),
    h("td", { class: "num" }, fmt(r.policy_version)),
    h("td", { class: "num" }, r.duration === null ? "–" : `${fixed(r.duration, 2)} s`)));
    document.getElementById("results-table").replaceChildren(rows.length ? table(
      ["seq", "rollout", "data source", "status", "reward", "masked", "failure", "policy v", "duration"],
      rows) : h("p", { class: "muted" }, "No finished results match."));
  },

  older() {
    if (Results.nextBefore === null || Results.nextBefore === undefined) return;
    Results.cursors.push(Results.nextBefore);
    Results.load();
  },

  newer() {
    if (Results.cursors.length > 1) Results.cursors.pop();
    Results.load();
  },
};
