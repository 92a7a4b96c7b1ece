"""How much this process holds, to decide whether freeing memory is worth its cost.

The large-model frees (a full ``gc.collect``, ``malloc_trim``, the walk over every object that clears
onnxscript's and onnxslim's pattern matchers: see ``onnx_export.py``) are what lets a ViT-L/H export fit
(issue 32), but each walks the whole heap: about 0.3-0.4 s with torch, timm and onnx loaded, ten and
more times per export. A process under :data:`RELEASE_ABOVE_BYTES` gains nothing from them (what the
matchers keep is one small graph, bounded, not a leak that grows), so they are skipped there.
"""

from __future__ import annotations

import resource
import sys

RELEASE_ABOVE_BYTES = 3 << 29  # 1.5 GiB resident


def _status_bytes(*keys: str) -> dict[str, int]:
    """Fields of /proc/self/status (Linux; kB there) in bytes; empty where there is no /proc."""
    found: dict[str, int] = {}
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                key = line.split(":", 1)[0]
                if key in keys:
                    found[key] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return found


def current_rss_bytes() -> int:
    """This process's resident set now (Linux /proc), else its high-water mark."""
    return _status_bytes("VmRSS").get("VmRSS") or peak_rss_bytes()


def peak_rss_bytes() -> int:
    """This process's resident-set high-water mark: getrusage's ru_maxrss (KiB on Linux, bytes on macOS),
    and never below /proc's VmHWM and VmRSS. The kernel keeps RSS in per-CPU counters; recent kernels
    sum them exactly for /proc/self/status but getrusage reads the approximate value, so ru_maxrss can
    lag VmRSS by a few hundred KiB (seen on 6.18: 715.7 MB now, 715.5 MB "peak"), more with more CPUs
    the threads ran on; a peak below the current set would be no peak."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak = int(peak if sys.platform == "darwin" else peak * 1024)
    return max(peak, *_status_bytes("VmHWM", "VmRSS").values())


def worth_releasing() -> bool:
    """True when the process holds enough that freeing memory pays for the heap walk."""
    return current_rss_bytes() >= RELEASE_ABOVE_BYTES
