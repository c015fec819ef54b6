// One rollout: its outcome, evaluation, timeline, LLM calls, messages and tokens.
"use strict";

const LONG_TEXT = 600; // characters shown before a text folds

const Rollout = {
  section: null,
  generation: 0, // of the latest show(): an older one's responses are dropped

  mount(section) { Rollout.section = section; },

  badLink(text) {
    Rollout.generation += 1; // a show() still waiting draws nothing
    Rollout.section.replaceChildren(h("h1", {}, "bad link"),
      h("p", { class: "error", id: "bad-link" }, `bad link: "${text}" is not a rollout id (malformed % escape)`),
      h("p", {}, h("a", { href: "#results" }, "results")));
  },

  async show(id) {
    const generation = ++Rollout.generation;
    const current = () => generation === Rollout.generation;
    const section = Rollout.section;
    section.replaceChildren(h("p", { class: "muted" }, `loading ${id}…`));
    let view;
    try {
      view = await apiGet(`v1/rollouts/${encodeURIComponent(id)}`);
    } catch (error) {
      if (current()) section.replaceChildren(h("p", { class: "error" }, error.message));
      return;
    }
    if (!current()) return; // another rollout was asked for meanwhile
    if (!view.result) {
      section.replaceChildren(h("h1", {}, id), h("p", {}, `in flight: ${view.status} (no result yet)`));
      return;
    }
    const r = view.result;
    const tokenBox = h("div", { id: "token-box" }, h("p", { class: "muted" }, "decoding tokens…"));
    section.replaceChildren(
      h("h1", {}, h("a", { href: "#results" }, "results"), " / ", r.id),
      Rollout.outcome(r),
      h("h2", {}, "Evaluation"), Rollout.evaluation(r.evaluation),
      h("h2", {}, "Timeline"), Rollout.timeline(r.timing),
      h("h2", {}, "LLM calls"), Rollout.turns(r.trajectory.turns),
      h("h2", {}, "Messages and tool calls"), Rollout.messages(r.trajectory.messages),
      h("h2", {}, "Fidelity"), keyValueTable(r.trajectory.fidelity),
      h("h2", {}, "Tokens"), tokenBox,
    );
    let texts = new Map();
    try {
      const decoded = await apiGet(`v1/rollouts/${encodeURIComponent(id)}/tokens`);
      texts = new Map(decoded.ids.map((tokenId, i) => [tokenId, decoded.texts[i]]));
    } catch (error) {
      tokenBox.before(h("p", { class: "error" }, `token texts unavailable (${error.message}): showing ids`));
    }
    if (!current()) return;
    tokenBox.replaceChildren(Tokens.view(r.trajectory, texts));
  },

  outcome(r) {
    const t = r.trajectory;
    return h("div", { class: "columns" }, keyValueTable({
      data_source: r.data_source, status: r.status, reward: r.reward, mask: r.mask,
      mask_reason: r.mask_reason, ended_by: t.ended_by, stale: r.stale, attempt: r.attempt,
    }), keyValueTable({
      task_id: r.task_id, group_id: r.group_id, sample_index: r.sample_index, seq: r.seq,
      policy_versions: t.policy_versions.join(", ") || "–", trainable: t.trainable,
      sequences: t.sequence_count, turns: r.stats.turns,
    }), r.failure ? h("div", { class: "failure" }, h("strong", {}, `${r.failure.kind} failure in ${r.failure.stage}`),
      h("pre", {}, r.failure.message)) : null);
  },

  // The handler's details: scalars as a table (extracted vs gold side by side), lists of
  // objects (tests) as tables, long text folded.
  evaluation(evaluation) {
    if (!evaluation) return h("p", { class: "muted" }, "nothing was evaluated");
    const parts = [];
    let answer = null;
    if ("extracted" in evaluation || "gold" in evaluation) {
      const same = JSON.stringify(evaluation.extracted) === JSON.stringify(evaluation.gold);
      answer = (h("table", { class: "answer" }, h("tbody", {},
        h("tr", {}, h("th", {}, "extracted"), h("td", { id: "eval-extracted" }, show(evaluation.extracted))),
        h("tr", {}, h("th", {}, "gold"), h("td", { id: "eval-gold", class: same ? "ok" : "" }, show(evaluation.gold))))));
    }
    const scalars = {};
    for (const [key, value] of Object.entries(evaluation)) {
      if (key === "extracted" || key === "gold") continue;
      if (Array.isArray(value) && value.length && value.every((v) => v && typeof v === "object" && !Array.isArray(v))) {
        parts.push(h("h3", {}, key), objectsTable(value));
      } else if (typeof value === "string" && value.length > 80) {
        parts.push(h("h3", {}, key), foldedText(value));
      } else if (value && typeof value === "object" && !Array.isArray(value)) {
        parts.push(h("h3", {}, key), keyValueTable(value));
      } else {
        scalars[key] = Array.isArray(value) ? value.map(show).join(", ") : value;
      }
    }
    return h("div", { id: "evaluation" }, answer, keyValueTable(scalars), parts);
  },

  timeline(timing) {
    const order = [["queued_init", "queued"], ["init", "init"], ["queued_run", "queued"], ["run", "run"],
                   ["queued_eval", "queued"], ["eval", "eval"]];
    const total = Math.max(1e-9, order.reduce((a, [k]) => a + (timing[k] || 0), 0));
    const bars = order.filter(([k]) => (timing[k] || 0) > 0).map(([key, kind]) =>
      h("div", { class: `seg seg-${kind}`, title: `${key}: ${fmt(timing[key], 3)} s`,
                 style: { flexGrow: String(timing[key] / total) } }, `${key.replace("queued_", "wait ")} ${fmt(timing[key], 2)}s`));
    const known = new Set(["queued", ...order.map(([k]) => k), "total"]);
    const extra = Object.fromEntries(Object.entries(timing).filter(([k]) => !known.has(k))
      .map(([k, v]) => [`${k} (s)`, v]));
    return h("div", { id: "timeline" }, h("div", { class: "segments" }, bars),
      h("p", { class: "muted" }, `total ${fmt(timing.total, 3)} s; within run: `,
        Object.entries(extra).map(([k, v]) => `${k} ${fmt(v, 3)}`).join(" · ") || "–"));
  },

  turns(turns) {
    if (!turns.length) return h("p", { class: "muted" }, "no LLM call");
    return table(["turn", "seq", "backend", "policy v", "prompt +", "sampled", "mean logprob", "finish", "tool calls"],
      turns.map((t, i) => {
        // A -inf logprob arrives as null: the mean is then -inf too (null would add as 0).
        const finite = t.logprobs.every((lp) => typeof lp === "number");
        const mean = !t.logprobs.length ? null
          : finite ? t.logprobs.reduce((a, b) => a + b, 0) / t.logprobs.length : "−∞";
        return h("tr", {}, h("td", { class: "num" }, i + 1), h("td", { class: "num" }, t.sequence || 0),
          h("td", {}, t.backend), h("td", { class: "num" }, fmt(t.policy_version)),
          h("td", { class: "num" }, fmt(t.prompt_ids_delta.length)), h("td", { class: "num" }, fmt(t.output_ids.length)),
          h("td", { class: "num" }, fmt(mean, 3)), h("td", {}, t.finish_reason),
          h("td", {}, t.tool_calls.map((c) => c.name).join(", ")));
      }));
  },

  messages(messages) {
    return h("div", { id: "messages" }, messages.map((m, i) => {
      const content = typeof m.content === "string" ? m.content : (m.content === null || m.content === undefined ? "" : JSON.stringify(m.content, null, 2));
      const calls = Array.isArray(m.tool_calls) ? m.tool_calls : [];
      return h("div", { class: `message role-${String(m.role).replace(/[^a-z_]/gi, "")}`, dataset: { index: i } },
        h("div", { class: "role" }, m.role, m.name ? ` · ${m.name}` : "", m.tool_call_id ? ` · ${m.tool_call_id}` : ""),
        content ? foldedText(content) : null,
        calls.map((c) => h("pre", { class: "tool-call" }, `→ ${c.function ? c.function.name : c.name}(${
          c.function ? c.function.arguments : JSON.stringify(c.arguments)})`)));
    }));
  },
};

function show(value) {
  if (value === null || value === undefined) return "–";
  return typeof value === "string" ? value : JSON.stringify(value);
}

function foldedText(text) {
  if (text.length <= LONG_TEXT) return h("pre", { class: "text" }, text);
  return h("details", {}, h("summary", {}, h("pre", { class: "text" }, `${text.slice(0, LONG_TEXT)}…`),
    h("span", { class: "muted" }, `(${fmt(text.length)} characters: open for all)`)),
    h("pre", { class: "text" }, text));
}
