"""The image (Dockerfile, .dockerignore): what it starts from, runs as, installs and copies."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

from tests.deploy.manifests import (
    ROOT,
    assert_tandem_command,
    dockerfile_env,
    dockerfile_exec,
    dockerfile_instructions,
    final_stage,
)


def test_dockerfile_entrypoint_is_the_tandem_cli():
    entrypoint = dockerfile_exec("ENTRYPOINT")
    assert entrypoint == ["tandem"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts.get("tandem") == "cli.main:main", "the image's entrypoint is not the project's tandem script"
    assert_tandem_command([*entrypoint, *dockerfile_exec("CMD")], "Dockerfile ENTRYPOINT + CMD")


def test_dockerfile_base_user_cache_and_extras():
    froms = [rest for ins, rest in dockerfile_instructions() if ins == "FROM"]
    args = {}
    for ins, rest in dockerfile_instructions():
        if ins == "ARG" and "=" in rest:
            key, _, value = rest.partition("=")
            args.setdefault(key, value)
    base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], froms[-1].split()[0])
    assert re.fullmatch(r"nvidia/cuda:1[2-9]\.\d+(\.\d+)?-runtime-ubuntu2[2-9]\.04", base), \
        f"the final image should start from a CUDA runtime image, not {base}"
    # Ubuntu 22.04 ships Python 3.10: the project needs 3.11+
    assert not base.endswith("ubuntu22.04"), "Ubuntu 22.04's python3 is 3.10; the project requires >= 3.11"

    users = [rest for ins, rest in final_stage() if ins == "USER"]
    assert users, "the image runs as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "USER must be a numeric non-root uid (Kubernetes runAsNonRoot checks it)"

    installs = " ".join(rest for ins, rest in dockerfile_instructions() if ins == "RUN" and "pip install" in rest)
    assert re.search(r"\[gpu\]", installs), "the image does not install the gpu extra"

    env = dockerfile_env()
    assert env.get("PATH", "").startswith("/opt/tandem/bin"), "the tandem venv is not first on PATH"
    cache = env.get("TANDEM_CACHE")
    assert cache, "TANDEM_CACHE is not set in the image"
    volumes = [v for ins, rest in final_stage() if ins == "VOLUME" for v in json.loads(rest)]
    assert cache in volumes, f"the model cache {cache} is not a VOLUME"


def test_dockerfile_cache_variable_is_the_one_the_engine_reads(monkeypatch):
    from engine.assets import cache_dir

    cache = dockerfile_env()["TANDEM_CACHE"]
    monkeypatch.setenv("TANDEM_CACHE", cache)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_dir() == Path(cache)


def test_dockerfile_copies_every_package_and_dockerignore_keeps_them():
    import fnmatch

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    needed = packages | {"pyproject.toml", pyproject["project"]["readme"]}
    copies = [shlex.split(rest) for ins, rest in dockerfile_instructions() if ins == "COPY" and "--from" not in rest]
    copied = {src.rstrip("/") for *sources, _ in copies for src in sources}
    assert "." in copied or needed <= copied, f"not copied into the image: {sorted(needed - copied)}"
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    dropped = {n for n in needed for p in patterns if fnmatch.fnmatch(n, p.rstrip("/"))}
    assert not dropped, f".dockerignore drops what the image needs: {sorted(dropped)}"
    assert all((ROOT / n).exists() for n in needed)
