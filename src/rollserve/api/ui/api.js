// The dashboard's access to the server: the token, JSON GETs and the SSE stream, and a
// DOM helper. Everything a policy or a task wrote is put in the page as text
// (textContent), never parsed as HTML.
"use strict";

const TOKEN_KEY = "rollserve.apiToken";
const ROOT = new URL("../", window.location.href); // the page is served at <root>/ui/

class ApiError extends Error {
  constructor(status, detail) {
    super(`${status}: ${detail}`);
    this.status = status;
    this.detail = detail;
  }
}

// h("div", {class: "x", onclick: fn}, "text", child...): an element; strings become text.
function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "style") Object.assign(node.style, value); // CSSOM: allowed by the CSP
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function fmt(value, digits) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "number") {
    if (Number.isInteger(value)) return value.toLocaleString("en-US");
    return value.toFixed(digits === undefined ? 2 : digits);
  }
  return String(value);
}

// A number with exactly `digits` decimals (1 -> "1.000"), or "–".
function fixed(value, digits) {
  return typeof value === "number" ? value.toFixed(digits) : "–";
}

const Auth = {
  token() { return window.sessionStorage.getItem(TOKEN_KEY); },
  headers() {
    const token = Auth.token();
    return token ? { Authorization: `Bearer ${token}` } : {};
  },
  forget() {
    window.sessionStorage.removeItem(TOKEN_KEY);
    document.getElementById("forget-token").hidden = true;
  },
  _asking: null,
  // Show the token form once (concurrent 401s wait for the same answer).
  ask(wrong) {
    if (Auth._asking) return Auth._asking;
    const box = document.getElementById("login");
    const form = document.getElementById("login-form");
    const input = document.getElementById("token-input");
    document.getElementById("login-error").textContent =
      wrong ? "The server refused that token." : "";
    box.hidden = false;
    input.value = "";
    input.focus();
    Auth._asking = new Promise((resolve) => {
      form.onsubmit = (event) => {
        event.preventDefault();
        window.sessionStorage.setItem(TOKEN_KEY, input.value.trim());
        input.value = "";
        box.hidden = true;
        document.getElementById("forget-token").hidden = false;
        Auth._asking = null;
        resolve();
      };
    });
    return Auth._asking;
  },
};

function apiUrl(path, params) {
  const url = new URL(path.replace(/^\//, ""), ROOT);
  for (const [key, value] of Object.entries(params || {})) {
    if (value !== null && value !== undefined && value !== "") url.searchParams.set(key, value);
  }
  return url;
}

async function apiGet(path, params) {
  for (;;) {
    const response = await fetch(apiUrl(path, params), { headers: Auth.headers(), cache: "no-store" });
    if (response.status === 401) {
      await Auth.ask(Auth.token() !== null);
      continue;
    }
    if (!response.ok) {
      let detail = response.statusText;
      try { detail = (await response.json()).detail || detail; } catch (e) { /* not JSON */ }
      throw new ApiError(response.status, detail);
    }
    return response.json();
  }
}

// A server-sent events parser: feed it the decoded text chunk by chunk as it arrives;
// it calls onEvent(name, data) for each complete event. Lines end in "\r\n", "\n" or
// "\r"; a chunk that ends in "\r" keeps it until the next one, which may start with
// the "\n" of the same line end (normalised alone, the pair would become an empty
// line: an event cut in two).
function sseParser(onEvent) {
  let buffer = "";
  let held = "";
  return (chunk) => {
    let text = held + chunk;
    held = text.endsWith("\r") ? "\r" : "";
    if (held) text = text.slice(0, -1);
    buffer += text.replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) onEvent(name, data.join("\n"));
    }
  };
}

// Server-sent events read with fetch (EventSource cannot send the Authorization
// header): calls onEvent(name, data) for each event; reconnects after a drop, at
// most every 2 s, until signal aborts. onState("open" | "retrying") reports the link.
async function apiStream(path, params, onEvent, onState, signal) {
  while (!signal.aborted) {
    try {
      const response = await fetch(apiUrl(path, params), {
        headers: { ...Auth.headers(), Accept: "text/event-stream" }, cache: "no-store", signal,
      });
      if (response.status === 401) {
        await Auth.ask(Auth.token() !== null);
        continue;
      }
      if (!response.ok || !response.body) throw new ApiError(response.status, response.statusText);
      onState("open");
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      const parser = sseParser(onEvent);
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        parser(value);
      }
    } catch (error) {
      if (signal.aborted) return;
    }
    onState("retrying");
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}
