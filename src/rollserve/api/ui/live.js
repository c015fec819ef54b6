// The live view: drawn from each `status` event of GET /v1/status/stream.
"use strict";

const RATE_WINDOW = 5;

const Live = {
  section: null,
  history: [], // the last snapshots' counts, for rates
  charts: null,

  mount(section) {
    Live.section = section;
    Live.charts = {
      rollouts: new LineChart("rollouts / s (5 s mean)", "/s"),
      tokens: new LineChart("sampled tokens / s (5 s mean, at finish)", "/s"),
    };
    section.replaceChildren(
      h("div", { id: "live-cards", class: "cards" }),
      h("div", { class: "charts" }, Live.charts.rollouts.node, Live.charts.tokens.node),
      h("h2", {}, "Stages"), h("div", { id: "live-stages" }),
      h("h2", {}, "Inference backends"), h("div", { id: "live-router" }), h("div", { id: "live-backends" }),
      h("div", { id: "live-judges-box", hidden: true }, h("h2", {}, "Judges (EVAL, outside the policy's pool)"),
        h("div", { id: "live-judges" })),
      h("div", { id: "live-nodes-box", hidden: true }, h("h2", {}, "Nodes"), h("div", { id: "live-nodes" })),
      h("div", { class: "columns" },
        h("div", {}, h("h2", {}, "Sandboxes"), h("div", { id: "live-sandboxes" })),
        h("div", {}, h("h2", {}, "Trajectories: fidelity and staleness"), h("div", { id: "live-trajectories" })),
        h("div", {}, h("h2", {}, "Groups"), h("div", { id: "live-groups" }))),
    );
  },

  update(status) {
    const finished = Object.values(status.finished).reduce((a, b) => a + b, 0);
    const tokens = status.trajectories.output_tokens || 0;
    // Rates over the last RATE_WINDOW snapshots (about as many seconds): smoother than
    // one snapshot to the next.
    const history = Live.history;
    if (history.length && status.uptime_s < history[history.length - 1].uptime_s) {
      history.length = 0; // another server (restarted): start over
      Live.charts.rollouts.points = [];
      Live.charts.tokens.points = [];
    }
    history.push({ uptime_s: status.uptime_s, finished, tokens, stages: status.stages });
    if (history.length > RATE_WINDOW + 1) history.shift();
    const rates = { stages: {} };
    const first = history[0];
    const dt = status.uptime_s - first.uptime_s;
    if (dt > 0) {
      rates.rollouts = Math.max(0, finished - first.finished) / dt;
      rates.tokens = Math.max(0, tokens - first.tokens) / dt;
      for (const [stage, snap] of Object.entries(status.stages)) {
        const before = first.stages[stage];
        if (before) rates.stages[stage] = Math.max(0, snap.done - before.done) / dt;
      }
      Live.charts.rollouts.add(status.uptime_s, rates.rollouts);
      Live.charts.tokens.add(status.uptime_s, rates.tokens);
    }
    Live.cards(status, finished);
    Live.stages(status, rates.stages);
    Live.backends(status);
    Live.judges(status);
    Live.nodes(status);
    Live.sandboxes(status.sandboxes);
    Live.keyValues("live-trajectories", status.trajectories);
    Live.keyValues("live-groups", status.groups);
  },

  cards(status, finished) {
    const card = (id, label, value, sub) =>
      h("div", { class: "card" }, h("div", { class: "card-label" }, label),
        h("div", { class: "card-value", id }, value), sub ? h("div", { class: "card-sub" }, sub) : null);
    const byStatus = Object.entries(status.finished).map(([k, v]) => `${k} ${v}`).join(" · ");
    document.getElementById("live-cards").replaceChildren(
      card("live-in-flight", "in flight", fmt(status.in_flight), `of ${fmt(status.max_pending)} max pending`),
      card("live-finished", "finished", fmt(finished), byStatus || "since start"),
      card("live-throughput", "throughput", `${fmt(status.throughput_per_s)}/s`, "last minute"),
      card("live-policy", "policy version", fmt(status.llm.policy_version),
           status.llm.paused ? `paused (${status.llm.pause_mode})` : "generating"),
      card("live-last-seq", "results cursor", fmt(status.last_seq), "newest seq"),
      card("live-uptime", "uptime", `${fmt(status.uptime_s / 60, 1)} min`, `${status.handlers.length} data sources`),
    );
  },

  stages(status, rates) {
    const rows = Object.entries(status.stages).map(([stage, s]) =>
      h("tr", { dataset: { stage } }, h("td", {}, stage), h("td", { class: "num queued" }, fmt(s.queued)),
        h("td", { class: "num busy" }, fmt(s.busy)), h("td", { class: "num free" }, fmt(s.workers - s.busy)),
        h("td", { class: "num" }, fmt(s.workers)), h("td", { class: "num done" }, fmt(s.done)),
        h("td", { class: "num" }, rates[stage] === undefined ? "–" : fmt(rates[stage], 2)),
        h("td", { class: "bar-cell" }, h("div", { class: "bar" },
          h("div", { class: "bar-fill", style: { width: `${(100 * s.busy / Math.max(1, s.workers)).toFixed(1)}%` } })))));
    document.getElementById("live-stages").replaceChildren(table(
      ["stage", "queued", "busy", "free", "slots", "done", "done/s (5 s)", "busy slots"], rows));
  },

  backends(status) {
    const r = status.llm;
    document.getElementById("live-router").replaceChildren(h("p", { class: "muted" },
      `router: ${r.policy} · in flight ${r.in_flight} · calls ${r.calls} · retries ${r.retries} · `
      + `failed ${r.failed} · aborted by pause ${r.aborted_by_pause} · moves ${r.moves}`));
    const rows = status.backends.map((b) =>
      h("tr", { dataset: { backend: b.name } }, h("td", {}, b.name), h("td", {}, b.kind),
        h("td", { class: b.healthy ? "ok" : "bad" }, b.draining ? "draining" : (b.healthy ? "healthy" : "down")),
        h("td", { class: "num" }, fmt(b.outstanding)), h("td", { class: "num" }, fmt(b.sessions)),
        h("td", { class: "num" }, fmt(b.calls)), h("td", { class: "num" }, fmt(b.failures)),
        h("td", { class: "num" }, b.unit_cost_ms === null ? "–" : `${fmt(b.unit_cost_ms, 1)} ms`),
        h("td", {}, b.model || ""), h("td", { class: "error" }, b.last_error || "")));
    document.getElementById("live-backends").replaceChildren(table(
      ["backend", "kind", "health", "in flight", "sessions", "calls", "failures", "latency / request",
       "model", "last error"], rows));
  },

  // The judges (`judges` in /v1/status: JudgeState; empty without --judge).
  judges(status) {
    const judges = Array.isArray(status.judges) ? status.judges : [];
    document.getElementById("live-judges-box").hidden = judges.length === 0;
    if (!judges.length) return;
    const health = (j) => (j.healthy === null ? "unused" : (j.healthy ? "healthy" : "down"));
    const rows = judges.map((j) =>
      h("tr", { dataset: { judge: j.name } }, h("td", {}, j.name), h("td", {}, String(j.backend.kind || "")),
        h("td", { class: j.healthy === false ? "bad" : "ok" }, health(j)),
        h("td", { class: "num" }, `${fmt(j.in_flight)} / ${fmt(j.concurrency)}`),
        h("td", { class: "num" }, fmt(j.calls.ok || 0)), h("td", { class: "num" }, fmt(j.calls.failed || 0)),
        h("td", { class: "num" }, fmt(j.calls.timeout || 0)), h("td", { class: "error" }, j.last_error || "")));
    document.getElementById("live-judges").replaceChildren(table(
      ["judge", "kind", "health", "in flight / limit", "ok", "failed", "timed out", "last error"], rows));
  },

  // Per-node rows in the Ray mode (`nodes` in /v1/status: NodeStatus; null on one machine).
  nodes(status) {
    const nodes = Array.isArray(status.nodes) ? status.nodes : [];
    document.getElementById("live-nodes-box").hidden = nodes.length === 0;
    if (!nodes.length) return;
    const stages = (counts) => ["init", "run", "eval"].map((k) => fmt((counts || {})[k] || 0)).join(" / ");
    const rows = nodes.map((n) => h("tr", {},
      h("td", {}, n.name), h("td", { class: n.alive ? "ok" : "bad" },
        n.alive ? (n.draining ? "draining" : "alive") : "dead"),
      h("td", { class: "num" }, fmt(n.slots)), h("td", { class: "num" }, fmt(n.hosted)),
      h("td", { class: "num" }, stages(n.busy)), h("td", { class: "num" }, stages(n.done)),
      h("td", { class: "num" }, fmt(n.placed)), h("td", { class: "num" }, fmt(n.lost)),
      h("td", { class: "num" }, fmt(n.sandboxes_open)), h("td", { class: "num" }, fmt(n.reaped_at_start))));
    document.getElementById("live-nodes").replaceChildren(table(
      ["node", "state", "slots", "hosted", "busy init / run / eval", "done init / run / eval",
       "placed", "lost", "sandboxes open", "reaped at start"], rows));
  },

  sandboxes(s) {
    const reaped = s.reaped_at_start;
    Live.keyValues("live-sandboxes", {
      runtime: s.ready ? s.runtime : `${s.runtime} (not ready: ${s.error})`,
      open: s.open, started: s.started,
      "reaped at start": reaped ? `${reaped.sandboxes} sandboxes, ${reaped.processes_killed} processes` : "–",
    });
  },

  keyValues(id, object) {
    document.getElementById(id).replaceChildren(keyValueTable(object));
  },
};

function table(headers, rows) {
  return h("table", {}, h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
           h("tbody", {}, rows));
}

function keyValueTable(object) {
  return h("table", { class: "kv" }, h("tbody", {}, Object.entries(object).map(([key, value]) =>
    h("tr", { dataset: { key } }, h("th", {}, key.replaceAll("_", " ")),
      h("td", { class: "num" }, typeof value === "object" && value !== null ? JSON.stringify(value) : fmt(value))))));
}

function objectsTable(objects) {
  const keys = [...new Set(objects.flatMap((o) => Object.keys(o)))];
  return table(keys, objects.map((o) => h("tr", {}, keys.map((k) => {
    const v = o[k];
    return h("td", {}, typeof v === "object" && v !== null ? JSON.stringify(v) : fmt(v));
  }))));
}
