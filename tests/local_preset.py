"""A harness preset of our own, for testing the preset framework for real: a tiny npm
package (``rollserve-test-harness``, its ``bin`` a Node script that calls the gateway
over Chat Completions) packed here, put in a private npm cache (npm prefers it to the registry), and a committed-style
lockfile that names it by its integrity, so ``rollserve harness install rs-test``
runs ``npm ci`` offline, as an operator's own preset would.

``make_local_preset(root)`` writes ``<root>/presets/rs-test.toml`` and
``<root>/presets/locks/rs-test/`` and returns the environment npm needs (its cache,
offline). Also used by ``benchmarks/harness_overhead.py``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

NAME = "rs-test"
PACKAGE = "rollserve-test-harness"

# The harness: reads its config (written by the preset's [files], the forwarder's
# address expanded inside), reports what it sees, then asks the policy until a reply
# holds the stop text or max_turns calls were made.
HARNESS_JS = r"""#!/usr/bin/env node
const fs = require("fs"), http = require("http"), os = require("os"), path = require("path");
const config = JSON.parse(fs.readFileSync(path.join(os.homedir(), ".rs-harness", "config.json"), "utf8"));
const task = fs.readFileSync(process.env.ROLLSERVE_TASK_FILE, "utf8");
let installWritable = "no";
try { fs.writeFileSync(path.join(path.dirname(__dirname), "planted"), "x"); installWritable = "yes"; } catch (e) {}
console.log("REPORT " + JSON.stringify({
  base: config.base_url, model: config.model, home: os.homedir(), cwd: process.cwd(),
  flag: process.env.RS_FLAG || null, installWritable, node: process.execPath,
  onPath: (process.env.PATH || "").split(":").slice(0, 2)}));
// (node:http, not fetch: fetch's parser is WebAssembly, which needs more address space
// than a sandbox's RLIMIT_AS leaves where no cgroup caps memory.)
function post(url, body) {
  return new Promise((resolve, reject) => {
    const request = http.request(url, {method: "POST", headers: {"content-type": "application/json",
      authorization: "Bearer " + process.env.OPENAI_API_KEY}}, response => {
      let text = "";
      response.setEncoding("utf8");
      response.on("data", chunk => { text += chunk; });
      response.on("end", () => resolve({status: response.statusCode, text}));
    });
    request.on("error", reject);
    request.end(JSON.stringify(body));
  });
}
async function main() {
  const messages = [{role: "user", content: task}];
  for (let turn = 0; turn < Number(process.env.ROLLSERVE_MAX_TURNS); turn++) {
    const started = performance.now();
    const r = await post(config.base_url + "/chat/completions", {model: config.model, messages});
    if (r.status !== 200) { console.log("HTTP " + r.status + " " + r.text); process.exit(2); }
    const text = JSON.parse(r.text).choices[0].message.content || "";
    console.log("GOT " + JSON.stringify({text, ms: performance.now() - started}));
    messages.push({role: "assistant", content: text});
    if (text.includes(config.stop)) return;
    messages.push({role: "user", content: "go on"});
  }
}
main().catch(e => { console.error(String(e), e.cause ? String(e.cause) : ""); process.exit(3); });
"""

PRESET_TOML = """
name = "rs-test"
summary = "rollserve's own test harness: a Node script over Chat Completions"
wire = "openai-chat"
tool_calls = "none"

[package]
kind = "npm"
name = "rollserve-test-harness"
versions = "^1.0.0"
node = "{node}"
bin = "rs-harness"

[run]
command = 'exec rs-harness'

[env]
RS_FLAG = "on"

[files]
".rs-harness/config.json" = '''
{{"base_url": "${{OPENAI_BASE_URL}}", "model": "${{ROLLSERVE_MODEL}}",
  "stop": "${{ROLLSERVE_OPT_STOP}}"}}
'''

[options.stop]
default = "DONE"
description = "the text that ends the harness's loop"
"""


def npm_available() -> str | None:
    """Why the local preset cannot be built here (no npm/node), or None."""
    missing = [b for b in ("npm", "node") if shutil.which(b) is None]
    return f"{' and '.join(missing)} not on PATH" if missing else None


def make_local_preset(root: Path, work: Path, node: str = ">=18") -> dict[str, str]:
    """The preset files under ``root/presets``; the package built in ``work``; the
    environment for ``npm`` (a private cache holding the package, offline)."""
    package = work / "package"
    (package / "bin").mkdir(parents=True, exist_ok=True)
    (package / "package.json").write_text(
        json.dumps({"name": PACKAGE, "version": "1.0.0", "bin": {"rs-harness": "bin/harness.js"}})
    )
    (package / "bin" / "harness.js").write_text(HARNESS_JS)
    os.chmod(package / "bin" / "harness.js", 0o755)
    env = {
        **os.environ,
        "npm_config_cache": str(work / "npm-cache"),
        "npm_config_prefer_offline": "true",
        "npm_config_update_notifier": "false",
    }
    subprocess.run(
        ["npm", "pack", "--pack-destination", str(work)],
        cwd=package,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    tarball = work / f"{PACKAGE}-1.0.0.tgz"
    subprocess.run(["npm", "cache", "add", str(tarball)], env=env, check=True, capture_output=True, timeout=120)
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
    locks = root / "presets" / "locks" / NAME
    locks.mkdir(parents=True, exist_ok=True)
    project = {"name": f"rollserve-harness-{NAME}", "private": True, "dependencies": {PACKAGE: "1.0.0"}}
    (locks / "package.json").write_text(json.dumps(project, indent=2))
    (locks / "package-lock.json").write_text(
        json.dumps(
            {
                "name": project["name"],
                "lockfileVersion": 3,
                "requires": True,
                "packages": {
                    "": {"name": project["name"], "dependencies": {PACKAGE: "1.0.0"}},
                    f"node_modules/{PACKAGE}": {
                        "version": "1.0.0",
                        "integrity": integrity,
                        "bin": {"rs-harness": "bin/harness.js"},
                        "resolved": f"https://registry.npmjs.org/{PACKAGE}/-/{PACKAGE}-1.0.0.tgz",
                    },
                },
            },
            indent=2,
        )
    )
    (root / "presets" / f"{NAME}.toml").write_text(PRESET_TOML.format(node=node))
    return env
