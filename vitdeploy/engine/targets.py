"""Named Jetson targets (``jp6.2-orin-nano``, ``jp7.1-agx-thor``, ``jp7.2.2-agx-orin``) and the on-device
install check, both read from the JetPack matrix in ``jetpack``.

A target fixes what a plan made away from the device must assume: the TensorRT version (hence its
API, its ONNX parser rules and the lowering that parser needs), the GPU's compute capability, and how
many DLA cores that TensorRT can use on that module. ``build-engine --target jp7.1-agx-thor --dry-run``
plans exactly that; ``--dla-core`` on a module without DLA is refused before anything else.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..errors import ConfigError, UserError
from . import jetpack
from .jetpack import MODULES, RELEASE_BY_KEY, RELEASES, Module, Release

_NAME = re.compile(r"^(?:jp|jetpack-?)(\d+(?:\.\d+){1,2})(?:-(.+))?$", re.IGNORECASE)
# Short module names people type, mapped to the matrix's keys ("orin-nx" is ambiguous on DLA count: 16GB).
_ALIASES = {"thor": "agx-thor", "agx-thor": "agx-thor", "orin-nx": "orin-nx-16gb", "nano": "orin-nano",
            "orin": "agx-orin", "xavier": "agx-xavier", "t5000": "agx-thor"}


@dataclass(frozen=True)
class JetsonTarget:
    """A JetPack stack, optionally on one module."""

    release: Release
    module: Optional[Module] = None

    @property
    def name(self) -> str:
        return f"jp{self.release.jetpack}" + (f"-{self.module.key}" if self.module else "")

    @property
    def trt_version(self) -> str:
        return self.release.tensorrt

    @property
    def dla_cores(self) -> Optional[int]:
        """DLA cores usable here; None when no module was named (depends on which)."""
        return None if self.module is None else jetpack.dla_cores(self.release, self.module)

    def unconfirmed(self, only: Optional[tuple] = None) -> List[str]:
        """The facts of this target no stored source confirmed (``only``: just these fields)."""
        keep = (lambda f: True) if only is None else (lambda f: f in only)  # noqa: E731
        out = [f"JetPack {self.release.jetpack} {f}" for f in self.release.unconfirmed if keep(f)]
        if self.module is not None:
            out += [f"{self.module.name} {f}" for f in self.module.unconfirmed if keep(f)]
        return out

    def to_dict(self) -> Dict[str, Any]:
        data: Dict[str, Any] = {"name": self.name, **jetpack.facts(self.release)}
        if self.module is not None:
            data["module"] = {"key": self.module.key, "name": self.module.name, "compute_capability": self.module.compute_capability,
                              "dla_cores_hardware": self.module.dla_cores, "dla_cores_usable": self.dla_cores,
                              "unconfirmed": list(self.module.unconfirmed), "notes": list(self.module.notes),
                              "sources": {k: jetpack.SOURCES[k] for k in self.module.sources}}
        return data


def is_target_name(text: Optional[str]) -> bool:
    return bool(text) and bool(_NAME.match(str(text)))


def resolve(name: str) -> JetsonTarget:
    """``jp6.2-orin-nano`` -> JetsonTarget; one clear line naming the known ones when it is not."""
    match = _NAME.match(str(name).strip())
    if not match:
        raise UserError(f"target {name!r} is not jpX.Y[-MODULE] (e.g. jp6.2-orin-nano, jp7.1-agx-thor); see `vitdeploy targets`")
    version, module_key = match.group(1), match.group(2)
    release = RELEASE_BY_KEY.get(version)
    if release is None:
        known = ", ".join(r.jetpack for r in RELEASES)
        raise UserError(f"JetPack {version} is not in vitdeploy's matrix (known: {known}); see `vitdeploy targets`")
    if module_key is None:
        return JetsonTarget(release)
    key = _ALIASES.get(module_key.lower(), module_key.lower())
    module = MODULES.get(key)
    if module is None:
        raise UserError(f"module {module_key!r} is not one of {', '.join(MODULES)}; see `vitdeploy targets`")
    if module.key not in release.modules:
        on = ", ".join(r.jetpack for r in RELEASES if module.key in r.modules)
        stack = f"TensorRT {release.tensorrt}" + ("" if release.tensorrt_package == "JetPack" else f", {release.tensorrt_package}")
        raise ConfigError(f"JetPack {release.jetpack} ({stack}) does not support {module.name}; "
                          f"JetPack releases that do: {on or 'none in the matrix'}")
    return JetsonTarget(release, module)


def check_dla(target: JetsonTarget, dla_core: Optional[int]) -> List[str]:
    """Refuse a DLA core the target cannot have; return notes for what sources leave open."""
    if dla_core is None:
        return []
    release, module = target.release, target.module
    if module is None:
        return [f"target {target.name} names no module: whether it has DLA core {dla_core} depends on the module "
                f"(give e.g. --target jp{release.jetpack}-agx-orin)"]
    usable = target.dla_cores or 0
    if module.dla_cores == 0:
        raise ConfigError(f"{module.name} has no DLA; drop --dla-core (the GPU runs the whole engine)")
    if release.dla is False:
        raise ConfigError(f"TensorRT {release.tensorrt} on JetPack {release.jetpack} does not run DLA; drop --dla-core")
    if release.dla_modules is not None and module.key not in release.dla_modules:
        raise ConfigError(f"TensorRT {release.tensorrt} runs DLA only on {', '.join(MODULES[m].name for m in release.dla_modules)}; "
                          f"drop --dla-core for {module.name}")
    if dla_core >= usable:
        raise ConfigError(f"{module.name} has {usable} DLA core(s) (0..{usable - 1}); --dla-core {dla_core} does not exist")
    notes = []
    if release.dla is None:
        notes.append(f"DLA with TensorRT {release.tensorrt} on JetPack {release.jetpack} is not confirmed by a stored source "
                     "(NVIDIA: 'TensorRT 10.7 was the last 10.x release that supported DLA'); TensorRT decides on the device")
    if "dla_cores" in module.unconfirmed:
        notes.append(f"{module.name}'s DLA count ({module.dla_cores}) is not confirmed by a stored source")
    return notes


def check_portability(target: JetsonTarget, hardware_compatibility: Optional[str]) -> None:
    """Refuse what NVIDIA documents as unavailable on JetPack: hardware-compatible engines (jetpack.SOURCES
    "nv-trt86-hwcompat"). Version-compatible and weight-stripped engines stay allowed."""
    if hardware_compatibility and hardware_compatibility != "none":
        raise ConfigError(f"--hardware-compatible {hardware_compatibility} is for discrete GPUs: TensorRT does not support "
                          f"hardware-compatible engines on JetPack (target {target.name}); drop it and build on each "
                          "Jetson model (`vitdeploy targets --sources` says where this was read)")


# -- the on-device install check ----------------------------------------------------------------------
DEVICE_MODEL = Path("/proc/device-tree/model")


@dataclass
class StackCheck:
    """This device's software stack against its JetPack row of the matrix."""

    l4t: Optional[str]
    jetpack: Optional[str]
    module: Optional[Module]
    release: Optional[Release]
    found: Dict[str, Optional[str]] = field(default_factory=dict)
    problems: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self) -> List[str]:
        head = (f"Jetson Linux {self.l4t} (JetPack {self.jetpack or 'unknown'})" if self.l4t else "not a Jetson (no /etc/nv_tegra_release)")
        out = [head + (f", {self.module.name}" if self.module else "")]
        out += [f"  {k}: {v if v is not None else 'not found'}" for k, v in self.found.items()]
        out += [f"  problem: {p}" for p in self.problems]
        out += [f"  note: {n}" for n in self.notes]
        out.append("  stack matches its JetPack row" if self.ok and self.release else "")
        return [line for line in out if line]


def check_stack(tegra_release: Optional[str], model: Optional[str], tensorrt: Optional[str], python: Optional[str] = None) -> StackCheck:
    """Compare what a device reports (text of /etc/nv_tegra_release and /proc/device-tree/model, the
    installed TensorRT and Python versions) with its JetPack row."""
    from .fingerprint import parse_tegra_release
    from .versions import TrtVersion

    python = python or f"{sys.version_info.major}.{sys.version_info.minor}"
    parsed = parse_tegra_release(tegra_release) if tegra_release else None
    l4t = parsed["l4t"] if parsed else None
    release = jetpack.release_for_l4t(l4t) if l4t else None
    module = jetpack.module_from_model(model) if model else None
    check = StackCheck(l4t, jetpack.jetpack_for_l4t(l4t) if l4t else None, module, release,
                       found={"tensorrt": tensorrt, "python": python, "model": (model or "").strip() or None})
    if l4t is None:
        check.notes.append("engines built here carry no JetPack; `vitdeploy targets` lists the Jetson rows")
        return check
    if release is None:
        check.problems.append(f"Jetson Linux {l4t} is not in vitdeploy's matrix: plans cannot name its TensorRT; "
                              "see `vitdeploy targets` and plan with --trt-version")
        return check
    if module is not None and module.key not in release.modules:
        check.problems.append(f"JetPack {release.jetpack} does not list {module.name} (the matrix may be wrong, or the image is)")
    if tensorrt is None:
        check.problems.append(f"no TensorRT Python module: JetPack {release.jetpack} ships TensorRT {release.tensorrt} in the system "
                              "dist-packages; make the venv with --system-site-packages")
    else:
        want, have = TrtVersion.parse(release.tensorrt), TrtVersion.parse(tensorrt)
        if (have.major, have.minor) != (want.major, want.minor):
            check.problems.append(f"TensorRT {have} is installed, JetPack {release.jetpack}'s row says {want}"
                                  + (" (unconfirmed)" if "tensorrt" in release.unconfirmed else "")
                                  + ": engines are tied to the TensorRT that builds them; plan with --trt-version "
                                  f"{have.major}.{have.minor} or reinstall JetPack's TensorRT")
    if python.split(".")[:2] != release.python.split(".")[:2]:
        check.notes.append(f"Python {python} here; JetPack {release.jetpack} ships {release.python} (JetPack's TensorRT bindings "
                           "are built for that one)")
    if release.unconfirmed:
        check.notes.append(f"not confirmed by a stored source for JetPack {release.jetpack}: {', '.join(release.unconfirmed)}")
    return check


def check_this_device() -> StackCheck:
    from .fingerprint import TEGRA_RELEASE
    from .versions import installed_version

    def read(path: Path) -> Optional[str]:
        try:
            return path.read_text(errors="replace").strip("\x00 \n")
        except OSError:
            return None

    trt = installed_version()
    return check_stack(read(TEGRA_RELEASE), read(DEVICE_MODEL), str(trt) if trt else None)


def all_targets() -> List[JetsonTarget]:
    """Every (JetPack, module) pair of the matrix, in release order."""
    return [JetsonTarget(r, MODULES[m]) for r in RELEASES for m in r.modules]
