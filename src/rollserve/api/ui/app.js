// The page: views by URL hash (#live, #results?filters, #rollout/<id>) and the one
// status stream that feeds the live view and refreshes the results table.
"use strict";

const App = {
  views: ["live", "results", "rollout"],
  status: null,

  start() {
    Live.mount(document.getElementById("view-live"));
    Results.mount(document.getElementById("view-results"));
    Rollout.mount(document.getElementById("view-rollout"));
    document.getElementById("forget-token").hidden = Auth.token() === null;
    document.getElementById("forget-token").addEventListener("click", () => {
      Auth.forget();
      window.location.reload();
    });
    const conn = document.getElementById("conn");
    apiStream("v1/status/stream", { interval: 1 }, (name, data) => {
      if (name !== "status") return;
      App.status = JSON.parse(data);
      Live.update(App.status);
      Results.onStatus(App.status);
    }, (state) => {
      conn.textContent = state === "open" ? "live" : "reconnecting…";
      conn.className = `conn ${state}`;
    }, new AbortController().signal);
    // After the stream is open: whatever a link holds, the live view keeps updating.
    window.addEventListener("hashchange", App.route);
    App.route();
  },

  route() {
    const hash = window.location.hash.replace(/^#/, "") || "live";
    const [path, query] = hash.split("?");
    const [view, ...rest] = path.split("/");
    const name = App.views.includes(view) ? view : "live";
    for (const other of App.views) document.getElementById(`view-${other}`).hidden = other !== name;
    for (const link of document.querySelectorAll("nav a")) {
      link.classList.toggle("active", link.dataset.view === name || (name === "rollout" && link.dataset.view === "results"));
    }
    if (name === "results") Results.show(new URLSearchParams(query || ""));
    if (name !== "rollout") return;
    let id;
    try {
      id = decodeURIComponent(rest.join("/"));
    } catch (error) { // a malformed escape (#rollout/%): URIError
      Rollout.badLink(rest.join("/"));
      return;
    }
    Rollout.show(id);
  },
};

App.start();
