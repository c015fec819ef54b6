"""Harness presets: agent programs rollserve did not write (Codex, Claude Code,
OpenCode, Qwen Code, Pi, mini-swe-agent, your own command), each a TOML file in
``presets/``, run in a rollout's sandbox behind the recording gateway.

- ``base``: the preset file's schema and the loader (``presets``, ``load_preset``).
- ``install``: the install root, whether a preset is installed (checked at submit),
  ``rollserve harness install`` (``npm ci`` on the committed lockfile in ``locks/``,
  Node from the npm registry where needed).
- ``runner``: the script and environment that start a preset's harness inside.
- ``semver``: npm's version ranges.
"""
