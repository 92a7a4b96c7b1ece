"""How much this process holds, to decide whether freeing memory is worth its cost.

The large-model frees (a full ``gc.collect``, ``malloc_trim``, the walk over every object that clears
onnxscript's and onnxslim's pattern matchers: see ``onnx_export.py``) are what lets a ViT-L/H export fit
(issue 32), but each walks the whole heap: about 0.3-0.4 s with torch, timm and onnx loaded, ten and
more times per export. A process under :data:`RELEASE_ABOVE_BYTES` gains nothing from them (what the
matchers keep is one small graph, bounded, not a leak that grows), so they are skipped there.
"""

from __future__ import annotations

import os

RELEASE_ABOVE_BYTES = 3 << 29  # 1.5 GiB resident


def resident_bytes() -> int | None:
    """This process's resident set now (Linux), None where /proc is not there."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def worth_releasing() -> bool:
    """True when the process holds enough that freeing memory pays for the heap walk (or cannot tell)."""
    held = resident_bytes()
    return held is None or held >= RELEASE_ABOVE_BYTES
