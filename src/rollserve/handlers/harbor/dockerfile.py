"""A Harbor task's ``environment/Dockerfile`` read for the host's system (bubblewrap).

With no image, the host's system stands in for the Dockerfile's base: a task is
declared compatible by a Dockerfile that only lays files out. Honoured: ``FROM`` (its
image is not used), ``WORKDIR`` (the last is the task's workdir), ``COPY``/``ADD`` of
files of the build context (``environment/``) to places under the workdir, ``ENV``,
``ARG``/``LABEL``/``EXPOSE``/``CMD``/``ENTRYPOINT``/``SHELL``/``STOPSIGNAL`` (nothing to
do: Harbor keeps its own command running). Refused, naming the line: ``RUN`` (it needs
the image: use an image runtime), ``USER``, ``VOLUME``, ``HEALTHCHECK`` (use
task.toml's), ``ONBUILD``, ``ADD`` of a URL, ``COPY --from``, and any destination
outside the workdir (only the workdir is the task's on the host's system).
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass, field

IGNORED = frozenset({"ARG", "LABEL", "EXPOSE", "CMD", "ENTRYPOINT", "SHELL", "STOPSIGNAL", "MAINTAINER"})


class DockerfileProblem(ValueError):
    pass


@dataclass
class HostPlan:
    """What the Dockerfile asks of the host's system: files to lay out (context path,
    absolute destination), the workdir, the environment."""

    copies: list[tuple[str, str]] = field(default_factory=list)
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)


def instructions(text: str) -> list[tuple[int, str, str]]:
    """(line number, keyword upper-cased, arguments), continuation lines joined."""
    out: list[tuple[int, str, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        keyword, _, args = whole.partition(" ")
        out.append((start, keyword.upper(), args.strip()))
    return out


def last_workdir(text: str) -> str | None:
    """The Dockerfile's last ``WORKDIR`` (relative ones joined to the one before), as an
    image built from it starts in; None where it sets none. Nothing else is read."""
    current, found = "/", None
    for _, keyword, args in instructions(text):
        if keyword == "WORKDIR":
            current = posixpath.normpath(posixpath.join(current, args.strip('"')))
            found = current
    return found


def host_plan(text: str, workdir: str | None) -> HostPlan:
    """The plan for the host's system; DockerfileProblem naming the line otherwise.
    ``workdir``: task.toml's ``environment.workdir``, which wins over ``WORKDIR``."""
    plan = HostPlan()
    current = "/"
    pending: list[tuple[int, str, str]] = []  # (line, source, destination as written)
    for number, keyword, args in instructions(text):
        where = f"environment/Dockerfile line {number}"
        if keyword == "FROM" or keyword in IGNORED:
            continue
        if keyword == "WORKDIR":
            current = posixpath.normpath(posixpath.join(current, args.strip('"')))
            plan.workdir = current
        elif keyword == "ENV":
            plan.env.update(_env(args, where))
        elif keyword in ("COPY", "ADD"):
            for source, destination in _copies(keyword, args, where):
                pending.append((number, source, posixpath.join(current, destination)))
        else:
            raise DockerfileProblem(
                f"{where}: {keyword} is not supported on the host's system "
                "(bubblewrap); run this task on an image runtime"
            )
    final = workdir or plan.workdir
    plan.workdir = final
    for number, source, destination in pending:
        target = posixpath.normpath(destination)
        inside = final is not None and (target == final or target.startswith(final.rstrip("/") + "/"))
        if not inside:
            raise DockerfileProblem(
                f"environment/Dockerfile line {number}: copies to {target}, "
                f"outside the workdir ({final or 'none set'}): only the "
                "workdir is the task's on the host's system"
            )
        plan.copies.append((source, target + ("/" if destination.endswith("/") else "")))
    return plan


def _env(args: str, where: str) -> dict[str, str]:
    try:
        words = shlex.split(args)
    except ValueError as error:
        raise DockerfileProblem(f"{where}: {error}") from None
    if len(words) >= 2 and "=" not in words[0]:  # ENV KEY value (old form)
        return {words[0]: " ".join(words[1:])}
    pairs = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise DockerfileProblem(f"{where}: ENV expects KEY=value")
        if "$" in value:
            raise DockerfileProblem(f"{where}: ENV values that expand variables are not supported")
        pairs[key] = value
    return pairs


def _copies(keyword: str, args: str, where: str) -> list[tuple[str, str]]:
    if args.startswith("["):
        raise DockerfileProblem(f"{where}: the JSON form of {keyword} is not supported")
    try:
        words = shlex.split(args)
    except ValueError as error:
        raise DockerfileProblem(f"{where}: {error}") from None
    flags = [w for w in words if w.startswith("--")]
    paths = [w for w in words if not w.startswith("--")]
    for flag in flags:
        if not flag.startswith(("--chown", "--chmod", "--link")):
            raise DockerfileProblem(f"{where}: {keyword} {flag.split('=')[0]} is not supported")
    if len(paths) < 2:
        raise DockerfileProblem(f"{where}: {keyword} needs a source and a destination")
    *sources, destination = paths
    if len(sources) > 1 and not destination.endswith("/"):
        destination += "/"
    for source in sources:
        if "://" in source:
            raise DockerfileProblem(f"{where}: {keyword} of a URL is not supported (no network)")
        if any(c in source for c in "*?["):
            raise DockerfileProblem(f"{where}: wildcards in {keyword} sources are not supported")
    return [(source, destination) for source in sources]
