"""The Jetson software matrix as data: JetPack <-> Jetson Linux (L4T) <-> CUDA <-> TensorRT <-> modules <-> DLA.

Every value here was read from a public source named in ``SOURCES`` (NVIDIA's JetPack and TensorRT
pages where they could be found, otherwise third-party records of real devices, labelled as such);
each reference is one a user can open: a URL, or a GitHub repository and a path in it
(tests/test_citations.py checks that). A value that no cited source confirms is still listed, because
a plan needs it, but its field is named in the row's ``unconfirmed`` tuple: ``vitdeploy targets``
prints it with a ``?`` and the plan says so. Nothing here was observed on a device by vitdeploy (no
Jetson was available).

Used by the fingerprint (L4T -> JetPack), the DLA rules ("Jetson Thor has no DLA"), the
``build-engine --target jpX.Y-<module>`` names, the on-device install check and ``vitdeploy targets``.
Core module: pure Python 3.8, no imports beyond the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

# -- where each fact was read ----------------------------------------------------------------------------
SOURCES: Dict[str, str] = {
    "nv-jp51": "https://developer.nvidia.com/embedded/jetpack-sdk-51 (JetPack 5.1: Jetson Linux 35.2.1, CUDA 11.4, "
               "TensorRT 8.5.2, cuDNN 8.6.0; AGX Orin 32GB, Orin NX 16GB, AGX Xavier, Xavier NX)",
    "nv-jp511": "https://developer.nvidia.com/embedded/jetpack-sdk-511 (JetPack 5.1.1: Jetson Linux 35.3.1, CUDA 11.4, "
                "TensorRT 8.5.2; adds Orin Nano 4GB/8GB, Orin NX 8GB, AGX Orin 64GB)",
    "nv-jp512": "https://developer.nvidia.com/embedded/jetpack-sdk-512 (JetPack 5.1.2: Jetson Linux 35.4.1, same compute stack as 5.1.1)",
    "nv-jp514": "https://developer.nvidia.com/embedded/jetpack-sdk-514 (JetPack 5.1.4: Jetson Linux 35.6.0, same compute stack as 5.1.3)",
    "pt-jp61": "https://pytorch.org/TensorRT/getting_started/jetpack.html (third party, Torch-TensorRT docs: JetPack 6.1 = "
               "CUDA 12.6, TensorRT 10.3, cuDNN 9.3)",
    "fpv-testenv": "SnapDragonfly/jetson-fpv doc/TESTENV.md (third party, jtop on real devices: JetPack 6.2 [L4T 36.4.3] "
                   "TensorRT 10.3.0.30, CUDA 12.6.68, Python 3.10.12; JetPack 5.1.4 [L4T 35.6.0] TensorRT 8.5.2.2, Python 3.8.10)",
    "dusty-l4t": "dusty-nv/jetson-containers jetson_containers/l4t_version.py (third party: L4T 36.3.0 = JetPack 6.0 GA, "
                 "36.4.0 = 6.1, 36.4.3 = 6.2, 35.2.1 = 5.1 ...; JetPack 6 targets sm_87 only; L4T > 36 is Ubuntu 24.04)",
    "nv-jp70": "https://developer.nvidia.com/embedded/jetpack/downloads/archive-7.0.md (JetPack 7.0 with Jetson Linux "
               "38.2/38.2.1, Jetson AGX Thor)",
    "nv-jp71": "https://developer.nvidia.com/embedded/jetpack/downloads/archive-7.1.md (JetPack 7.1 with Jetson Linux 38.4; "
               "adds the Jetson T4000 module; Jetson Thor on the unified CUDA 13.0)",
    "nv-r38-arch": "https://docs.nvidia.com/jetson/archives/r38.2.1/DeveloperGuide/AR/JetsonSoftwareArchitecture.html "
                   "(Jetson Linux 38: kernel 6.8, derived from Ubuntu 24.04 LTS, for Jetson Thor)",
    "nv-jp7": "https://developer.nvidia.com/EMBEDDED/jetpack.md (JetPack 7: full support for Jetson Orin and Thor; "
              "Developer Guide r39.2)",
    "nv-jp621-forum": "https://forums.developer.nvidia.com/t/jetpack-6-2-1-jetson-linux-36-4-4-is-now-live/337333 "
                      "(NVIDIA's announcement; its title pairs JetPack 6.2.1 with Jetson Linux 36.4.4)",
    "nv-cuda13-thor": "https://developer.nvidia.com/blog/whats-new-in-cuda-toolkit-13-0-for-jetson-thor-unified-arm-ecosystem-and-more "
                      "(CUDA 13.0 unified Arm toolkit for Jetson Thor; Orin (sm_87) stays on its current path)",
    "nv-sm110": "https://docs.nvidia.com/cuda/curanddx/release_notes.html (0.2.1: 'Thor SM renaming from sm_101 to sm_110 "
                "starting from CUDA 13.0; for CUDA 12.9 and older releases, Thor stays labeled as sm_101')",
    "nv-trt-drive-thor": "https://developer.nvidia.com/docs/drive/drive-os/7.0.3/public/drive-os-tensorrt-release-notes/"
                         "release-properties.html (TensorRT 10.10 for DRIVE OS: NVIDIA Thor, compute capability 10.1, DLA: No)",
    "nv-trt1141-jetson": "https://docs.nvidia.com/deeplearning/tensorrt/11.4.1/api/migration/tensorrt-10x-to-11x-jetson.html "
                         "(TensorRT 11.4.1 supports JetPack 7.2.2 or later on Jetson AGX Orin and Jetson Thor, SBSA build; "
                         "DLA on AGX Orin only under JetPack 7.2.2+; Jetson Thor has no DLA; JetPack 6.x stays on 10.x)",
    "nv-trt1141-dla": "https://docs.nvidia.com/deeplearning/tensorrt/11.4.1/inference-library/work-with-dla.html (DLA in "
                      "TensorRT 11.4.1: AGX Orin on JetPack 7.2.2+ only; 'Jetson Thor, which has no DLA'; DLA unavailable "
                      "in 11.0-11.3; 'TensorRT 10.7 was the last 10.x release that supported DLA')",
    "nv-trt-changelog": "NVIDIA/TensorRT CHANGELOG.md (main): 10.13.2 'Added support for CUDA 13.0'; 10.16 'Default CUDA "
                        "version updated to CUDA 13.2'",
    "nv-dla-sw": "https://github.com/NVIDIA/Deep-Learning-Accelerator-SW (README: Orin SoCs feature up to two "
                 "second-generation DLAs, Xavier SoCs up to two first-generation; '2x DLA' on Jetson AGX Orin 64GB)",
    "nv-trt86-hwcompat": "https://blog.csdn.net/ycx_ccc/article/details/135821294 (third party, quoting NVIDIA's TensorRT 8.6 "
                         "Developer Guide, 'Hardware Compatibility': hardware compatibility is only supported for Ampere and "
                         "later device architectures and is not supported on NVIDIA DRIVE OS or JetPack; NVIDIA's own page "
                         "could not be read here)",
    "jtop-cuda-table": "rbonghi/jetson_stats jtop/core/jetson_variables.py (third party: CUDA_TABLE tegra194 = 7.2, "
                       "tegra23x (Orin) = 8.7)",
}


@dataclass(frozen=True)
class Module:
    """One Jetson module family member: its GPU architecture and how many DLA cores it has."""

    key: str
    name: str
    family: str  # xavier | orin | thor
    compute_capability: str
    dla_cores: int
    model_strings: Tuple[str, ...]  # substrings of /proc/device-tree/model that identify it (case-insensitive)
    sources: Tuple[str, ...]
    unconfirmed: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = ()

    def is_confirmed(self, fact: str) -> bool:
        return fact not in self.unconfirmed


MODULES: Dict[str, Module] = {m.key: m for m in (
    Module("agx-xavier", "Jetson AGX Xavier", "xavier", "7.2", 2, ("agx xavier",), ("jtop-cuda-table", "nv-dla-sw"),
           notes=("DLA count: 'Xavier SoCs feature up to two first-generation DLAs' (nv-dla-sw)",)),
    Module("xavier-nx", "Jetson Xavier NX", "xavier", "7.2", 2, ("xavier nx",), ("jtop-cuda-table", "nv-dla-sw"),
           unconfirmed=("dla_cores",), notes=("DLA count per module not in a cited source (the SoC has up to two)",)),
    Module("agx-orin", "Jetson AGX Orin", "orin", "8.7", 2, ("agx orin",), ("nv-cuda13-thor", "jtop-cuda-table", "nv-dla-sw")),
    Module("orin-nx-16gb", "Jetson Orin NX 16GB", "orin", "8.7", 2, ("orin nx",), ("nv-cuda13-thor", "jtop-cuda-table"),
           unconfirmed=("dla_cores",), notes=("DLA count per module not in a cited source (the Orin SoC has up to two)",)),
    Module("orin-nx-8gb", "Jetson Orin NX 8GB", "orin", "8.7", 1, ("orin nx",), ("nv-cuda13-thor", "jtop-cuda-table"),
           unconfirmed=("dla_cores",), notes=("DLA count per module not in a cited source",)),
    Module("orin-nano", "Jetson Orin Nano", "orin", "8.7", 0, ("orin nano",), ("nv-cuda13-thor", "jtop-cuda-table"),
           unconfirmed=("dla_cores",), notes=("'no DLA' is not confirmed by a cited NVIDIA source; treated as none",)),
    Module("agx-thor", "Jetson AGX Thor (T5000)", "thor", "11.0", 0, ("thor",), ("nv-sm110", "nv-trt1141-dla", "nv-trt-drive-thor"),
           notes=("compute capability 11.0 under CUDA 13 (10.1 under CUDA 12.x)",)),
    Module("t4000", "Jetson T4000", "thor", "11.0", 0, ("t4000",), ("nv-jp71",),
           unconfirmed=("compute_capability", "dla_cores"),
           notes=("taken as a Thor-family module; its SM and DLA are not separately confirmed",)),
)}


@dataclass(frozen=True)
class Release:
    """One JetPack software stack as vitdeploy targets it."""

    jetpack: str
    l4t: Tuple[str, ...]  # Jetson Linux releases of this JetPack (exact, 3 parts)
    cuda: str
    tensorrt: str
    ubuntu: str
    python: str
    modules: Tuple[str, ...]
    dla: Optional[bool]  # does this stack's TensorRT run DLA (on modules that have it)? None: not stated by a source
    sources: Tuple[str, ...]
    unconfirmed: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = ()
    dla_modules: Optional[Tuple[str, ...]] = None  # only these modules get DLA (TensorRT 11.4.1: AGX Orin)
    tensorrt_package: str = "JetPack"  # where TensorRT comes from

    @property
    def key(self) -> str:
        return self.jetpack

    def is_confirmed(self, fact: str) -> bool:
        return fact not in self.unconfirmed


_ORIN = ("agx-orin", "orin-nx-16gb", "orin-nx-8gb", "orin-nano")
_JP5_51 = ("agx-xavier", "xavier-nx", "agx-orin", "orin-nx-16gb")
_JP5 = ("agx-xavier", "xavier-nx") + _ORIN

RELEASES: Tuple[Release, ...] = (
    Release("5.1", ("35.2.1",), "11.4", "8.5.2", "20.04", "3.8", _JP5_51, True, ("nv-jp51", "dusty-l4t"),
            unconfirmed=("python",), notes=("Python 3.8 is Ubuntu 20.04's; seen on JetPack 5.1.4 devices (fpv-testenv)",)),
    Release("5.1.1", ("35.3.1",), "11.4", "8.5.2", "20.04", "3.8", _JP5, True, ("nv-jp511", "dusty-l4t"), unconfirmed=("python",)),
    Release("5.1.2", ("35.4.1",), "11.4", "8.5.2", "20.04", "3.8", _JP5, True, ("nv-jp512", "dusty-l4t"), unconfirmed=("python",)),
    Release("5.1.3", ("35.5.0",), "11.4", "8.5.2", "20.04", "3.8", _JP5, True, ("nv-jp514",),
            unconfirmed=("l4t", "python"), notes=("L4T 35.5.0 for 5.1.3 is not in a cited source",)),
    Release("5.1.4", ("35.6.0",), "11.4", "8.5.2", "20.04", "3.8", _JP5, True, ("nv-jp514", "fpv-testenv")),
    Release("6.0", ("36.3.0",), "12.2", "8.6.2", "22.04", "3.10", _ORIN, True, ("dusty-l4t",),
            unconfirmed=("cuda", "tensorrt", "python"),
            notes=("TensorRT 8.6.2 / CUDA 12.2 are not confirmed by a cited NVIDIA page",)),
    Release("6.1", ("36.4.0",), "12.6", "10.3.0", "22.04", "3.10", _ORIN, True, ("pt-jp61", "dusty-l4t"), unconfirmed=("python",)),
    Release("6.2", ("36.4.3",), "12.6", "10.3.0", "22.04", "3.10", _ORIN, True, ("fpv-testenv", "dusty-l4t")),
    Release("6.2.1", ("36.4.4",), "12.6", "10.3.0", "22.04", "3.10", _ORIN, True, ("nv-jp621-forum",),
            unconfirmed=("cuda", "tensorrt", "python"),
            notes=("Jetson Linux 36.4.4 per NVIDIA's announcement; the stack is assumed equal to 6.2",)),
    Release("7.0", ("38.2.0", "38.2.1"), "13.0", "10.13.3", "24.04", "3.12", ("agx-thor",), False,
            ("nv-jp70", "nv-r38-arch", "nv-cuda13-thor", "nv-trt-changelog", "nv-trt1141-dla"),
            unconfirmed=("tensorrt", "python"),
            notes=("TensorRT 10.13 is not named by a cited JetPack 7.0 page; 10.13.2 is the first TensorRT with CUDA 13.0",
                   "Python 3.12 is Ubuntu 24.04's",)),
    Release("7.1", ("38.4.0",), "13.0", "10.13.3", "24.04", "3.12", ("agx-thor", "t4000"), False,
            ("nv-jp71", "nv-r38-arch", "nv-trt1141-dla"), unconfirmed=("tensorrt", "python"),
            notes=("TensorRT 10.13 is not named by a cited JetPack 7.1 page",)),
    Release("7.2", ("39.2.0",), "13.2", "10.16.1", "24.04", "3.12", _ORIN + ("agx-thor", "t4000"), None,
            ("nv-jp7", "nv-trt-changelog", "nv-trt1141-dla"), unconfirmed=("l4t", "cuda", "tensorrt", "python"),
            notes=("the first JetPack with Orin and Thor on one stack (nv-jp7, Developer Guide r39.2); Jetson Linux 39.2.0, "
                   "CUDA 13.2 and TensorRT 10.16 are not named by a cited JetPack 7.2 page (10.16 is the TensorRT whose "
                   "default CUDA is 13.2)",
                   "DLA with this TensorRT is not stated by a cited source; NVIDIA's TensorRT 11.4.1 DLA page says "
                   "'TensorRT 10.7 was the last 10.x release that supported DLA'")),
    Release("7.2.1", ("39.2.1",), "13.2", "10.16.2", "24.04", "3.12", _ORIN + ("agx-thor", "t4000"), None,
            ("nv-jp7", "dusty-l4t", "nv-trt1141-dla"), unconfirmed=("l4t", "cuda", "tensorrt", "python"),
            notes=("Jetson Linux 39.2.1, CUDA 13.2, TensorRT 10.16.2 and Python 3.12 as a third-party record of an Orin "
                   "Nano Super showed them, whose repository could not be named: not confirmed; the module list is 7.2's",
                   "DLA with TensorRT 10.16 is not stated by a cited source (see 7.2)")),
    Release("7.2.2", ("39.2.2",), "13.2", "11.4.1", "24.04", "3.12", ("agx-orin", "agx-thor"), True,
            ("nv-trt1141-jetson", "nv-trt1141-dla"), unconfirmed=("l4t", "cuda", "python"), dla_modules=("agx-orin",),
            tensorrt_package="TensorRT 11.4.1 SBSA build (installed on JetPack 7.2.2+)",
            notes=("the JetPack 7.2.2 Jetson Linux release number is not in a cited source",)),
)
RELEASE_BY_KEY: Dict[str, Release] = {r.jetpack: r for r in RELEASES}
# Sources of facts about every Jetson target rather than one row (what `targets --sources` also prints).
GENERAL_SOURCES: Tuple[str, ...] = ("nv-trt86-hwcompat",)

# Releases vitdeploy has no row for but can still name (the fingerprint's L4T -> JetPack lookup).
_OTHER_L4T = {"35.1.0": "5.0.2", "36.2.0": "6.0 DP"}  # nv JetPack 5.0.2 page (35.1); dusty-l4t (36.2.0 = 6.0 DP)
_MAJOR_ONLY = {"35": "5.x", "36": "6.x", "38": "7.x", "39": "7.x"}


def _l4t_key(text: str) -> str:
    parts = [p for p in str(text).strip().lstrip("Rr").split(".") if p]
    return ".".join((parts + ["0", "0"])[:3])


def jetpack_for_l4t(l4t: str) -> Optional[str]:
    """The JetPack of an exact Jetson Linux release; the major line ('6.x') for one not in the table."""
    key = _l4t_key(l4t)
    for release in RELEASES:
        if key in release.l4t and "l4t" not in release.unconfirmed:
            return release.jetpack
    if key in _OTHER_L4T:
        return _OTHER_L4T[key]
    for release in RELEASES:  # rows whose L4T number is itself unconfirmed still name it, marked
        if key in release.l4t:
            return release.jetpack
    major = key.split(".")[0]
    return _MAJOR_ONLY.get(major)


def release_for_l4t(l4t: str) -> Optional[Release]:
    key = _l4t_key(l4t)
    return next((r for r in RELEASES if key in r.l4t), None)


def module_from_model(model: str) -> Optional[Module]:
    """The module a /proc/device-tree/model string names ('NVIDIA Jetson AGX Orin Developer Kit' -> agx-orin).
    Orin NX 8GB and 16GB print the same model string; the 16GB entry stands for both (see ``dla_cores``)."""
    text = model.lower()
    for module in MODULES.values():
        if any(s in text for s in module.model_strings):
            return module
    return None


def dla_cores(release: Release, module: Module) -> int:
    """DLA cores this stack's TensorRT can use on ``module`` (0 where either has none)."""
    if release.dla is False or module.dla_cores == 0:
        return 0
    if release.dla_modules is not None and module.key not in release.dla_modules:
        return 0
    return module.dla_cores


def facts(release: Release) -> Dict[str, object]:
    """A row as plain data, with which fields no cited source confirms (for reports and `targets --json`)."""
    data = {
        "jetpack": release.jetpack, "l4t": list(release.l4t), "cuda": release.cuda, "tensorrt": release.tensorrt,
        "tensorrt_package": release.tensorrt_package, "ubuntu": release.ubuntu, "python": release.python,
        "modules": list(release.modules), "dla": release.dla, "dla_modules": list(release.dla_modules or ()),
        "unconfirmed": list(release.unconfirmed), "notes": list(release.notes),
        "sources": {key: SOURCES[key] for key in release.sources},
    }
    return data
