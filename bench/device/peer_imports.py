"""Importing the staged vLLM peer (bench/device/peer_import_check.py): each module's outcome, where a module and a
distribution came from, the absent packages loaded modules import inside functions, and on a machine without CUDA,
stand-ins for what needs it (the CUDA extensions; an H100 for the configuration step)."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata as md
import importlib.util
import os
import sys
import traceback
import types

from peer_modules import CUDA_EXTS, CUDA_MARKERS


def cuda_kind(exc: BaseException) -> bool:
    text = "".join(traceback.format_exception_only(type(exc), exc))
    cause = exc.__cause__ or exc.__context__
    if cause is not None:
        text += "".join(traceback.format_exception_only(type(cause), cause))
    return any(m in text for m in CUDA_MARKERS)


def top(name: str) -> str:
    return name.split(".")[0]


def forget(prefix: str) -> None:
    for m in [m for m in sys.modules if m == prefix or m.startswith(prefix + ".")]:
        del sys.modules[m]


def try_import(name: str) -> tuple[str, str]:
    """('ok'|'cuda'|'missing'|'error', detail)"""
    try:
        importlib.import_module(name)
        return "ok", ""
    except ModuleNotFoundError as e:
        if e.name and top(e.name) != "vllm":
            return "missing", f"no module {e.name!r}"
        if cuda_kind(e):
            return "cuda", str(e).splitlines()[0]
        return "error", f"{type(e).__name__}: {e}"
    except BaseException as e:  # noqa: BLE001 - report everything
        if cuda_kind(e):
            return "cuda", f"{type(e).__name__}: {str(e).splitlines()[0]}"
        tb = traceback.format_exc().strip().splitlines()
        return "error", f"{type(e).__name__}: {e} [{tb[-3].strip() if len(tb) > 2 else ''}]"


def stub_cuda_exts() -> list[str]:
    """On a CPU machine: stand-ins for the CUDA extensions that cannot load here."""
    stubbed = []
    root = os.path.dirname(importlib.util.find_spec("vllm").origin)
    for ext in CUDA_EXTS:
        base = os.path.join(root, *ext.split(".")[1:])
        if not any(os.path.exists(base + sfx) for sfx in (".abi3.so", ".so")):
            continue  # trimmed from the staged set
        if not ext.startswith("vllm.vllm_flash_attn."):
            # (the flash-attn package raises from its __init__ without an extension)
            try:
                importlib.import_module(ext)
                continue
            except BaseException as e:  # noqa: BLE001
                if not cuda_kind(e):
                    raise
        sys.modules[ext] = types.ModuleType(ext)
        stubbed.append(ext)
    return stubbed


def pretend_h100() -> None:
    """CPU only: make vLLM believe it runs on an H100 so that configuration can be built."""
    import vllm._custom_ops as ops
    import vllm.platforms as platforms
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability

    class PretendH100(CudaPlatform):
        @classmethod
        def get_device_capability(cls, device_id=0):
            return DeviceCapability(9, 0)

        @classmethod
        def get_device_name(cls, device_id=0):
            return "pretend H100"

        @classmethod
        def get_device_total_memory(cls, device_id=0):
            return 80 * 2**30

        @classmethod
        def is_fully_connected(cls, physical_device_ids):
            return True

        @classmethod
        def log_warnings(cls):
            pass

    old, new = platforms.current_platform, PretendH100()
    platforms.current_platform = new
    for name, mod in list(sys.modules.items()):  # those that did `from vllm.platforms import current_platform`
        if top(name) == "vllm" and isinstance(mod, types.ModuleType) and mod.__dict__.get("current_platform") is old:
            mod.current_platform = new
    # custom-op queries that run while the model class is inspected
    ops.cutlass_scaled_mm_supports_fp8 = lambda cap: True
    ops.cutlass_scaled_mm_supports_block_fp8 = lambda cap: True
    ops.cutlass_group_gemm_supported = lambda cap: True


def where(mod: types.ModuleType) -> str:
    f = getattr(mod, "__file__", None) or (list(getattr(mod, "__path__", [])) or ["?"])[0]
    return f or "?"


def dist_version(name: str) -> str:
    for cand in (name, name.replace("_", "-")):
        try:
            return md.version(cand)
        except md.PackageNotFoundError:
            pass
    try:
        for d in md.packages_distributions().get(name, []):
            return f"{md.version(d)} ({d})"
    except Exception:  # noqa: BLE001
        pass
    return str(getattr(sys.modules.get(name), "__version__", "?"))


def lazy_imports(names: set[str]) -> dict[str, set[str]]:
    """Third-party packages that loaded vllm modules import anywhere in their source and that
    are not importable here: {package: {vllm module, ...}}."""
    out: dict[str, set[str]] = {}
    stdlib = set(getattr(sys, "stdlib_module_names", ()))
    for modname in sorted(n for n in names if top(n) == "vllm"):
        path = getattr(sys.modules.get(modname), "__file__", None)
        if not path or not path.endswith(".py"):
            continue
        try:
            tree = ast.parse(open(path, encoding="utf-8").read())
        except (OSError, SyntaxError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                tops = [top(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = [top(node.module)]
            else:
                continue
            for t in tops:
                if t in stdlib or t == "vllm" or t in sys.modules:
                    continue
                if importlib.util.find_spec(t) is None:
                    out.setdefault(t, set()).add(modname)
    return out
