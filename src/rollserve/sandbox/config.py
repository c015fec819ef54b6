"""Runtime configs: one model per runtime, one tagged union of them all.

``rollserve serve --sandbox-runtime NAME --sandbox-options JSON`` is parsed here:
``runtime_config(NAME, options)`` is the options with ``runtime: NAME`` read as a
``RuntimeConfig``, a union tagged by ``runtime`` (as SWE-ReX does for its
deployments), so a name picks its model and a bad option is named with the ones the
runtime knows. Each model's ``runtime`` tag lists the names it is registered under
(apptainer/singularity, docker/podman). Pydantic only: the CLI checks options
without loading a runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import Field, TypeAdapter, ValidationError

from rollserve.sandbox.base import RuntimeConfigBase
from rollserve.sandbox.sandbox_python import PACKAGES
from rollserve.validation import field_name


class FolderConfig(RuntimeConfigBase):
    """What every folder runtime takes: where its sandboxes' folders go."""

    root: Path | None = Field(None, description="where sandbox folders go (None: the system temp folder)")


class ResidentFolderConfig(FolderConfig):
    """A folder runtime whose commands are the server's descendants: the resident
    memory cap can watch them (rsscap.py)."""

    resident_poll: float = Field(
        0.1,
        gt=0,
        le=10,
        description="seconds between two readings of a sandbox's resident "
        "memory, for specs with memory_mode 'resident' and no cgroup (rsscap.py): a sandbox "
        "gets past memory_mb by about its allocation rate x (this + the reading time) "
        "(bubblewrap, apptainer, local)",
    )


class BubblewrapConfig(ResidentFolderConfig):
    runtime: Literal["bubblewrap"] = "bubblewrap"
    bwrap: str = Field("bwrap", description="the bwrap binary (a name on PATH, or a path)")
    root_uids: tuple[int, int] | None = Field(
        (1_100_000_000, 100_000_000),
        description="(first, count): when the server is root, each sandbox runs as a "
        "random uid (and gid) from this range, used by no real user. None: sandboxes "
        "run as root (then the pids limit needs a cgroup)",
    )
    hide: list[str] = Field(
        default_factory=lambda: ["/root", "/home", "/run", "/var/tmp"],
        description="host folders replaced by an empty read-only tmpfs",
    )
    cgroup: str | None = Field("auto", description="'auto', 'off' or a delegated cgroup v2 folder")
    readonly_paths: list[str] = Field(
        default_factory=list,
        description="host paths also shown read-only inside, at the same place (even "
        "under a hidden folder, or with a rootfs image)",
    )
    share_interpreter: bool = Field(
        True,
        description="over the host root, give sandboxes a Python of their own: a venv of "
        "this server's base interpreter holding python_packages only (sandbox_python.py), "
        "shown read-only with that interpreter's standard library (also where a hidden "
        "folder covers it, e.g. a pyenv or conda build under /root or /home). The server's "
        "site-packages are hidden either way",
    )
    python_packages: list[str] = Field(
        default_factory=lambda: list(PACKAGES),
        description="distributions copied (with what they require) from this server's "
        "site-packages into the sandboxes' Python; those not installed here are left out",
    )
    python_cache: Path | None = Field(
        None,
        description="where the sandboxes' Python is made (None: ~/.cache/rollserve/"
        "sandbox-python, or, for a root server whose sandboxes cannot reach that, "
        "<root or the temp folder>/rollserve-python-0)",
    )


class ApptainerConfig(ResidentFolderConfig):
    runtime: Literal["apptainer", "singularity"] = Field(
        "apptainer", description="the binary to run: this one, else the other if only it is on PATH"
    )
    default_image: str | None = Field(
        None, description="the image of a spec that names none (None: such a spec is refused)"
    )
    image_cache: Path | None = Field(
        None, description="where built .sif files go (None: <state_dir>/images, else ~/.cache/rollserve/sif)"
    )
    max_concurrent_builds: int = Field(2, ge=1)
    build_timeout: float = Field(1800.0, gt=0)
    fakeroot: bool = False
    cgroup_limits: bool = Field(
        False, description="pass --memory/--pids-limit (needs cgroups v2 delegated to the user)"
    )
    extra_args: list[str] = Field(default_factory=list, description="more `exec` options")


class DockerConfig(FolderConfig):
    runtime: Literal["docker", "podman"] = Field("docker", description="the engine's binary")
    default_image: str = "python:3.12-slim"
    podman_runtime: str | None = Field("runc", description="podman --runtime (None: its default)")
    engine_timeout: float = Field(120.0, gt=0, description="bound on run/rm calls")
    pull_timeout: float = Field(3600.0, gt=0, description="bound on one `pull` (rollserve images pull)")
    rootfs_size: bool = Field(
        False,
        description="also cap the container's own filesystem at disk_mb (`--storage-opt "
        "size=`): needs a storage driver that supports it (overlay2 on xfs with pquota, btrfs, "
        "zfs); otherwise `run` fails",
    )
    extra_run_args: list[str] = Field(default_factory=list)


class LocalConfig(ResidentFolderConfig):
    runtime: Literal["local"] = "local"


RuntimeConfig: TypeAlias = Annotated[
    BubblewrapConfig | ApptainerConfig | DockerConfig | LocalConfig, Field(discriminator="runtime")
]
CONFIG_MODELS: tuple[type[RuntimeConfigBase], ...] = (BubblewrapConfig, ApptainerConfig, DockerConfig, LocalConfig)
_ADAPTER: TypeAdapter[RuntimeConfig] = TypeAdapter(RuntimeConfig)


def runtime_config(name: str, options: dict[str, Any] | None = None) -> RuntimeConfig:
    """``--sandbox-options`` for runtime ``name`` as its config; a ValueError naming
    each bad option, and the runtime's known options when one is not among them."""
    options = dict(options or {})
    if options.setdefault("runtime", name) != name:
        raise ValueError(
            f"sandbox options for {name!r} name another runtime ({options['runtime']!r}); leave 'runtime' out"
        )
    try:
        return _ADAPTER.validate_python(options)
    except ValidationError as error:
        raise ValueError(describe_config_error(name, error)) from None


def describe_config_error(name: str, error: ValidationError) -> str:
    """Each problem as ``option: message``; for an unknown option, the known ones."""
    known = {n: model for model in CONFIG_MODELS for n in model.names()}
    if name not in known:
        return f"unknown sandbox runtime {name!r}; known: {', '.join(known)}"
    model = known[name]
    problems, unknown = [], False
    for problem in error.errors():
        loc = problem["loc"][1:] if problem["loc"][:1] == (name,) else problem["loc"]
        problems.append(f"{field_name(loc, 'options')}: {problem['msg']}")
        unknown = unknown or problem["type"] == "extra_forbidden"
    message = f"bad option for sandbox runtime {name!r} ({model.__name__}): {'; '.join(problems)}"
    if unknown:
        options = [option for option in model.model_fields if option != "runtime"]
        message += f". Known options: {', '.join(options)}"
    return message
