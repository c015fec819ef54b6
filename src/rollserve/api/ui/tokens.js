// The token view: every token of a sequence, coloured by loss mask (prompt: grey;
// sampled: blue) and, when sampled, shaded by its probability (exp(logprob): the less
// likely, the darker), with the turn boundaries and the first fidelity mismatch.
"use strict";

const Tokens = {
  // Tokens drawn at once per sequence (one element each): past this a button draws the
  // next ones, so a long trajectory does not freeze the tab.
  CHUNK: 4000,

  // One sequence (a Tokens object) with the turns laid in it; texts: Map id -> text.
  sequence(index, tokens, turns, texts, fidelity) {
    const marks = new Map(); // position -> labels
    let at = 0;
    turns.forEach((turn) => {
      const label = `turn ${turn.number}`;
      if (turn.prompt_ids_delta.length) Tokens.mark(marks, at, `${label} · prompt +${turn.prompt_ids_delta.length}`);
      at += turn.prompt_ids_delta.length;
      Tokens.mark(marks, at, `${label} · sampled ${turn.output_ids.length} · ${turn.finish_reason}`);
      at += turn.output_ids.length;
    });
    const sampled = tokens.loss_mask.reduce((a, b) => a + b, 0);
    const box = h("div", { class: "tokens", dataset: { sequence: index } });
    const mismatch = fidelity && index === 0 ? fidelity.first_mismatch : null;
    const total = tokens.input_ids.length;
    const more = h("button", { type: "button", class: "more-tokens", hidden: true });
    let shown = 0;
    const draw = () => {
      const end = Math.min(total, shown + Tokens.CHUNK);
      box.append(Tokens.spans(tokens, marks, texts, mismatch, shown, end));
      shown = end;
      const next = Math.min(Tokens.CHUNK, total - shown);
      more.hidden = next === 0;
      more.textContent = `show ${fmt(next)} more tokens (${fmt(total - shown)} not shown)`;
    };
    more.addEventListener("click", draw);
    draw();
    return h("div", { class: "sequence" },
      h("p", { class: "muted token-counts" },
        `sequence ${index}: `, h("span", { class: "token-total" }, fmt(total)), " tokens · ",
        h("span", { class: "token-sampled" }, fmt(sampled)), " sampled (loss mask 1) · ",
        fmt(total - sampled), " prompt"),
      box, more);
  },

  // The tokens at positions [start, end), with the turn marks before them.
  spans(tokens, marks, texts, mismatch, start, end) {
    const fragment = document.createDocumentFragment();
    for (let i = start; i < end; i++) {
      for (const label of marks.get(i) || []) fragment.append(h("span", { class: "turn-mark" }, label));
      const id = tokens.input_ids[i];
      const mask = tokens.loss_mask[i];
      const logprob = tokens.logprobs[i];
      const text = texts.has(id) ? texts.get(id) : `[${id}]`;
      const span = document.createElement("span");
      span.className = mask ? "tok m1" : "tok m0";
      if (i === mismatch) span.classList.add("mismatch");
      span.textContent = text === "" ? "∅" : text.replaceAll("\n", "↵\n");
      let title = `#${i} id ${id} · loss mask ${mask}`;
      if (mask) {
        // A -inf logprob arrives as null (JSON has no -Infinity): p 0, the darkest shade.
        const finite = typeof logprob === "number" && Number.isFinite(logprob);
        const p = finite ? Math.exp(logprob) : 0;
        title += finite ? ` · logprob ${logprob.toFixed(3)} · p ${p.toFixed(3)}` : " · logprob −∞ · p 0";
        span.style.backgroundColor = `hsl(214, 85%, ${(42 + 48 * p).toFixed(0)}%)`;
        if (p < 0.35) span.classList.add("dark");
      }
      span.title = title;
      fragment.append(span);
    }
    return fragment;
  },

  mark(marks, at, label) {
    if (!marks.has(at)) marks.set(at, []);
    marks.get(at).push(label);
  },

  legend() {
    return h("p", { class: "legend" },
      h("span", { class: "tok m0" }, "prompt (loss mask 0)"), " ",
      h("span", { class: "tok m1 legend-high" }, "sampled, likely"), " ",
      h("span", { class: "tok m1 dark legend-low" }, "sampled, unlikely"), " ",
      h("span", { class: "turn-mark" }, "turn boundary"), " ",
      h("span", { class: "tok mismatch" }, "first fidelity mismatch"),
      h("span", { class: "muted" }, " · hover a token for its id and logprob"));
  },

  // The whole view of a trajectory: one block per sequence.
  view(trajectory, texts) {
    const numbered = trajectory.turns.map((turn, i) => ({ ...turn, number: i + 1 }));
    const sequences = trajectory.sequences.length ? trajectory.sequences : [trajectory.tokens];
    return h("div", { id: "token-view" }, Tokens.legend(), sequences.map((tokens, index) =>
      Tokens.sequence(index, tokens, numbered.filter((t) => (t.sequence || 0) === index), texts,
                      trajectory.fidelity)));
  },
};
