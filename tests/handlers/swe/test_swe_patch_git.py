"""``take_patch``'s git runs with none of the agent's configuration: the script it runs
in the sandbox, run here on a real repository the "agent" configured."""

from __future__ import annotations

import subprocess

from rollserve.handlers.swe.patch import DIFF_OPTIONS, TRUSTED_GIT


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def test_the_agents_git_configuration_neither_changes_the_patch_nor_runs(tmp_path):
    repo, home = tmp_path / "repo", tmp_path / "home"
    repo.mkdir()
    home.mkdir()
    git(repo, "init", "-q")
    (repo / "calc.py").write_text("x = 1\n")
    git(repo, "add", "-A")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "base")
    tree = git(repo, "rev-parse", "HEAD^{tree}").strip()
    # What an agent can set: prefixes, colour, an external diff, a textconv, a clean
    # filter, an fsmonitor hook, hooks, an included file, its global config.
    ran = tmp_path / "ran"
    run = f"sh -c 'echo $0 >> {ran}; cat' "
    for key, value in [
        ("diff.noprefix", "true"),
        ("diff.mnemonicPrefix", "true"),
        ("color.ui", "always"),
        ("diff.external", f"{run}ext"),
        ("diff.t.textconv", f"{run}textconv"),
        ("diff.t.command", f"{run}ext"),
        ("filter.f.clean", f"{run}clean"),
        ("core.fsmonitor", f"{run}fsmonitor"),
        ("core.hooksPath", str(tmp_path)),
        ("include.path", str(home / "more")),
    ]:
        git(repo, "config", key, value)
    (home / "more").write_text("[diff]\n\trelative = true\n\trenames = copies\n")
    (home / ".gitconfig").write_text("[diff]\n\tnoprefix = true\n")
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "attributes").write_text("* diff=t filter=f\n")
    (repo / "x").mkdir()
    (repo / "x" / "iniconfig.py").write_text("import os\n")
    (repo / "calc.py").write_text("x = 2\n")
    subprocess.run(
        ["git", "diff", "HEAD"],
        cwd=repo,
        capture_output=True,
        text=True,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
    )
    assert "ext" in ran.read_text() and "fsmonitor" in ran.read_text()  # the agent's git...
    ran.unlink()
    command = TRUSTED_GIT.format(command=f"git add -A && git diff --cached {DIFF_OPTIONS} {tree}")
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=repo,
        capture_output=True,
        text=True,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    assert "diff --git a/calc.py b/calc.py\n" in done.stdout
    assert "diff --git a/x/iniconfig.py b/x/iniconfig.py\n" in done.stdout
    assert "+++ b/x/iniconfig.py\n" in done.stdout and "\x1b[" not in done.stdout
    assert not ran.exists(), ran.read_text()
    assert "noprefix" not in (repo / ".git" / "config").read_text()
