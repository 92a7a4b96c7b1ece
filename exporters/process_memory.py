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


def current_rss_bytes() -> int:
    """This process's resident set now (Linux /proc), else its high-water mark."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """This process's resident-set high-water mark (getrusage: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def worth_releasing() -> bool:
    """True when the process holds enough that freeing memory pays for the heap walk."""
    return current_rss_bytes() >= RELEASE_ABOVE_BYTES
