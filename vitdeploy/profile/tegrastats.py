"""Jetson telemetry during a profile: tegrastats lines, the nvpmodel power mode, jetson_clocks.

A Jetson's latency depends on its power mode and clocks as much as on the engine, so a profile taken
on one records them: the nvpmodel mode (``nvpmodel -q``), whether jetson_clocks pinned the clocks
(``jetson_clocks --show``: minimum = maximum frequency), and, sampled by ``tegrastats`` while each
cell runs, RAM (shared by CPU and GPU on a Jetson, so it is also the GPU memory), CPU loads and
frequencies, GPU load (GR3D_FREQ), power rails and temperatures.

tegrastats' line format changed across L4T releases and boards, so the parser reads each field by
its own pattern and ignores what it does not know:

    RAM X/YMB (lfb NxZMB)   SWAP X/YMB (cached ZMB)   IRAM X/YkB(lfb ZkB)
    CPU [X%@F,X%@F,off,...]          (L4T >= 28)      cpu [X%,X%,...]@F   (older)
    EMC_FREQ X%@F   GR3D_FREQ X%@F | X%@[F,F]         EMC X%@F  GR3D X%@F (older)
    NAME@T.TC                         temperatures (CPU@39.5C, tj@53.5C, Tdiode@46.75C)
    RAIL cur/avg | RAIL curmW/avgmW   power rails in mW (VDD_IN, POM_5V_IN, VDD_CPU_GPU_CV, ...)
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from dataclasses import asdict, dataclass, field
from statistics import fmean
from typing import Any

_TIMESTAMP = re.compile(r"^\s*(\d{2}-\d{2}-\d{4} \d{2}:\d{2}:\d{2})")
_RAM = re.compile(r"\bRAM (\d+)/(\d+)MB(?:\s*\(lfb (\d+)x(\d+)([kM])B\))?")
_SWAP = re.compile(r"\bSWAP (\d+)/(\d+)MB(?:\s*\(cached (\d+)MB\))?")
_IRAM = re.compile(r"\bIRAM (\d+)/(\d+)kB\s*\(lfb (\d+)kB\)")
_CPU_NEW = re.compile(r"\bCPU \[([^\]]*)\]")
_CPU_OLD = re.compile(r"\bcpu \[([^\]]*)\]@(\d+)")
_EMC = re.compile(r"\bEMC(?:_FREQ)? (\d+)%(?:@(\d+))?")
_GR3D = re.compile(r"\bGR3D(?:_FREQ)? (\d+)%(?:@\[?([\d,]+)\]?)?")
_TEMP = re.compile(r"(?<![\w@%])([A-Za-z][\w-]*)@(-?\d+(?:\.\d+)?)C(?![\w])")
_RAIL = re.compile(r"\b([A-Z][A-Z0-9_]*) (\d+)(?:mW)?/(\d+)(?:mW)?(?![\w])")
_NOT_RAILS = {"RAM", "SWAP", "IRAM"}
# The rail that measures the whole module's input, by board generation (first one present wins).
INPUT_RAILS = ("VDD_IN", "POM_5V_IN", "VIN_SYS_5V0", "VDD_SYS_IN")


@dataclass
class TegraSample:
    """One tegrastats line. Fields a board does not print stay None / empty."""

    timestamp: str | None = None
    ram_used_mb: int | None = None
    ram_total_mb: int | None = None
    ram_lfb_blocks: int | None = None
    ram_lfb_block_mb: float | None = None
    swap_used_mb: int | None = None
    swap_total_mb: int | None = None
    swap_cached_mb: int | None = None
    iram_used_kb: int | None = None
    iram_total_kb: int | None = None
    iram_lfb_kb: int | None = None
    cpu_load_pct: list[float | None] = field(default_factory=list)  # None: core powered down ("off")
    cpu_freq_mhz: list[int | None] = field(default_factory=list)
    emc_load_pct: float | None = None
    emc_freq_mhz: int | None = None
    gpu_load_pct: float | None = None  # GR3D: the integrated GPU
    gpu_freq_mhz: list[int] = field(default_factory=list)  # one per GPC on Orin, one value before
    temps_c: dict[str, float] = field(default_factory=dict)
    rails_mw: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (current, average)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["rails_mw"] = {k: {"current": v[0], "average": v[1]} for k, v in self.rails_mw.items()}
        return data

    @property
    def input_power_mw(self) -> int | None:
        for name in INPUT_RAILS:
            if name in self.rails_mw:
                return self.rails_mw[name][0]
        return None


def parse_tegrastats_line(line: str) -> TegraSample:
    """Parse one tegrastats line; unknown fields are ignored, known ones are typed."""
    s = TegraSample()
    if m := _TIMESTAMP.search(line):
        s.timestamp = m.group(1)
    if m := _RAM.search(line):
        s.ram_used_mb, s.ram_total_mb = int(m.group(1)), int(m.group(2))
        if m.group(3):
            s.ram_lfb_blocks = int(m.group(3))
            s.ram_lfb_block_mb = int(m.group(4)) / (1024 if m.group(5) == "k" else 1)
    if m := _SWAP.search(line):
        s.swap_used_mb, s.swap_total_mb = int(m.group(1)), int(m.group(2))
        s.swap_cached_mb = int(m.group(3)) if m.group(3) else None
    if m := _IRAM.search(line):
        s.iram_used_kb, s.iram_total_kb, s.iram_lfb_kb = (int(g) for g in m.groups())
    if m := _CPU_NEW.search(line):
        for item in m.group(1).split(","):
            item = item.strip()
            if not item or item == "off":
                s.cpu_load_pct.append(None)
                s.cpu_freq_mhz.append(None)
                continue
            load, _, freq = item.partition("@")
            s.cpu_load_pct.append(float(load.rstrip("%")))
            s.cpu_freq_mhz.append(int(freq) if freq else None)
    elif m := _CPU_OLD.search(line):
        freq = int(m.group(2))
        for item in m.group(1).split(","):
            item = item.strip()
            s.cpu_load_pct.append(None if item == "off" else float(item.rstrip("%")))
            s.cpu_freq_mhz.append(None if item == "off" else freq)
    if m := _EMC.search(line):
        s.emc_load_pct = float(m.group(1))
        s.emc_freq_mhz = int(m.group(2)) if m.group(2) else None
    if m := _GR3D.search(line):
        s.gpu_load_pct = float(m.group(1))
        s.gpu_freq_mhz = [int(f) for f in (m.group(2) or "").split(",") if f]
    for name, value in _TEMP.findall(line):
        s.temps_c[name] = float(value)
    for name, cur, avg in _RAIL.findall(line):
        if name not in _NOT_RAILS:
            s.rails_mw[name] = (int(cur), int(avg))
    return s


def summarize_samples(samples: list[TegraSample]) -> dict[str, Any] | None:
    """Aggregate a cell's samples: means and maxima of what was printed."""
    if not samples:
        return None

    def values(getter: Any) -> list[float]:
        return [v for v in (getter(s) for s in samples) if v is not None]

    out: dict[str, Any] = {"samples": len(samples)}
    ram = values(lambda s: s.ram_used_mb)
    if ram:
        out["ram_used_mb_max"] = max(ram)
        out["ram_total_mb"] = samples[-1].ram_total_mb
    gpu = values(lambda s: s.gpu_load_pct)
    if gpu:
        out["gpu_load_pct_mean"] = fmean(gpu)
        out["gpu_load_pct_max"] = max(gpu)
    freqs = [f for s in samples for f in s.gpu_freq_mhz]
    if freqs:
        out["gpu_freq_mhz_max"] = max(freqs)
    cpu = [v for s in samples for v in s.cpu_load_pct if v is not None]
    if cpu:
        out["cpu_load_pct_mean"] = fmean(cpu)
    cpu_f = [v for s in samples for v in s.cpu_freq_mhz if v is not None]
    if cpu_f:
        out["cpu_freq_mhz_max"] = max(cpu_f)
    emc = values(lambda s: s.emc_load_pct)
    if emc:
        out["emc_load_pct_mean"] = fmean(emc)
    rails: dict[str, dict[str, float]] = {}
    for name in {n for s in samples for n in s.rails_mw}:
        cur = [s.rails_mw[name][0] for s in samples if name in s.rails_mw]
        rails[name] = {"mean_mw": fmean(cur), "max_mw": max(cur)}
    if rails:
        out["rails_mw"] = dict(sorted(rails.items()))
    power = values(lambda s: s.input_power_mw)
    if power:
        out["input_power_mw_mean"] = fmean(power)
    temps: dict[str, float] = {}
    for s in samples:
        for name, t in s.temps_c.items():
            temps[name] = max(t, temps.get(name, t))
    if temps:
        out["temps_c_max"] = dict(sorted(temps.items()))
    return out


# -- nvpmodel / jetson_clocks ------------------------------------------------------------------
_NVP_MODE = re.compile(r"NV Power Mode:\s*(\S.*?)\s*$", re.MULTILINE)


def parse_nvpmodel_query(text: str) -> dict[str, Any] | None:
    """``nvpmodel -q`` prints ``NV Power Mode: <NAME>`` and the mode id on the next line."""
    m = _NVP_MODE.search(text)
    if not m:
        return None
    name, rest = m.group(1), text[m.end():].split()
    mode_id = int(rest[0]) if rest and rest[0].isdigit() else None
    if mode_id is None and re.fullmatch(r"\S+ \d+", name):  # "NV Power Mode: MAXN 0": both on one line
        name, _, number = name.partition(" ")
        mode_id = int(number)
    return {"name": name, "id": mode_id}


# "cpu0: Gonvernor=interactive MinFreq=..." (TX1, L4T 28), "cpu0:  Online=1 Governor=schedutil MinFreq=..."
# (Orin, L4T 36), "GPU MinFreq=...", "EMC MinFreq=... FreqOverride=0", "DLA0_CORE:   Online=1 MinFreq=..." (L4T 39).
_CLOCK_LINE = re.compile(r"^\s*([A-Za-z][\w]*):?[ \t]+([^\n]*?)\bMinFreq=(\d+)\s+MaxFreq=(\d+)\s+CurrentFreq=(\d+)([^\n]*)$",
                         re.MULTILINE)
_KEY_VALUE = re.compile(r"(\w+)=(\S+)")
_TPCS = re.compile(r"^\s*Active GPU TPCs:\s*(\d+)", re.MULTILINE)
_ONLINE = re.compile(r"^\s*Online CPUs:\s*([\d,\-]+)", re.MULTILINE)


def parse_jetson_clocks_show(text: str) -> dict[str, Any] | None:
    """``jetson_clocks --show``: per-clock min/max/current (Hz for GPU/EMC/DLA/PVA, kHz for CPUs).

    jetson_clocks pins a clock by raising its minimum to its maximum, so ``locked`` is true when every
    online CPU and the GPU have min == max; ``unpinned`` names the clocks that still scale. The memory
    clock (EMC) counts as pinned at min == max (L4T 36+) or ``FreqOverride=1`` (L4T 28). Orin boards
    also print the active GPU TPCs (fewer TPCs, fewer SMs) and the DLA / PVA clocks; L4T 36+ ends with
    the ``NV Power Mode`` in force.
    """
    clocks: dict[str, dict[str, Any]] = {}
    for name, before, lo, hi, cur, after in _CLOCK_LINE.findall(text):
        entry: dict[str, Any] = {"min": int(lo), "max": int(hi), "current": int(cur)}
        for key, value in _KEY_VALUE.findall(before + " " + after):
            if key == "Online":
                entry["online"] = value == "1"
            elif key.endswith("nor"):  # "Governor", and TX1's "Gonvernor"
                entry["governor"] = value
            elif key == "FreqOverride":
                entry["freq_override"] = value == "1"
        clocks[name] = entry
    if not clocks:
        return None
    pinned = [n for n, c in clocks.items() if (n.startswith("cpu") and c.get("online", True)) or n == "GPU"]
    unpinned = [n for n in pinned if clocks[n]["min"] != clocks[n]["max"]]
    state: dict[str, Any] = {"locked": bool(pinned) and not unpinned, "unpinned": unpinned, "clocks": clocks}
    emc = clocks.get("EMC")
    state["emc_pinned"] = None if emc is None else (emc["min"] == emc["max"] or bool(emc.get("freq_override")))
    m = _TPCS.search(text)
    state["active_gpu_tpcs"] = int(m.group(1)) if m else None
    m = _ONLINE.search(text)
    state["online_cpus"] = m.group(1).strip(",") if m else None
    modes = _NVP_MODE.findall(text)
    state["power_mode"] = modes[-1] if modes else None
    return state


def describe_power_state(jetson: dict[str, Any] | None) -> str | None:
    """One line for a report: nvpmodel mode, jetson_clocks, the GPU TPCs and memory clock it showed."""
    if not jetson:
        return None
    mode = (jetson.get("nvpmodel") or {}).get("name") or "?"
    clocks = jetson.get("jetson_clocks")
    if not clocks:
        why = jetson.get("jetson_clocks_error")
        return f"nvpmodel {mode}, jetson_clocks unknown" + (f" ({why})" if why else "")
    if clocks.get("locked"):
        text = f"nvpmodel {mode}, jetson_clocks locked"
    else:
        text = f"nvpmodel {mode}, clocks not locked ({', '.join(clocks.get('unpinned') or []) or 'unknown'} still scale)"
    if clocks.get("emc_pinned") is False:
        text += ", EMC not pinned"
    if clocks.get("active_gpu_tpcs") is not None:
        text += f", {clocks['active_gpu_tpcs']} GPU TPCs active"
    return text


def _run_tool(args: list[str], timeout: float = 10.0) -> tuple[str | None, str | None]:
    exe = shutil.which(args[0])
    if exe is None:
        return None, None
    try:
        done = subprocess.run([exe, *args[1:]], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{args[0]} failed: {exc}"
    if done.returncode != 0:
        err = (done.stderr or done.stdout).strip().splitlines()
        return None, f"{' '.join(args)} exited {done.returncode}: {err[-1] if err else 'no output'}"
    return done.stdout, None


def jetson_power_state() -> dict[str, Any] | None:
    """nvpmodel mode and jetson_clocks state, or None on a machine without the Jetson tools."""
    if not any(shutil.which(tool) for tool in ("tegrastats", "nvpmodel", "jetson_clocks")):
        return None
    state: dict[str, Any] = {}
    out, err = _run_tool(["nvpmodel", "-q"])
    state["nvpmodel"] = parse_nvpmodel_query(out) if out else None
    if err:
        state["nvpmodel_error"] = err
    out, err = _run_tool(["jetson_clocks", "--show"])
    state["jetson_clocks"] = parse_jetson_clocks_show(out) if out else None
    if err:  # --show reads debugfs and usually needs root: say so rather than guess
        state["jetson_clocks_error"] = err
    return state


# -- sampling while a cell runs ----------------------------------------------------------------
def find_tegrastats() -> str | None:
    return shutil.which("tegrastats")


class TegrastatsSampler:
    """Run ``tegrastats --interval MS`` in the background and parse every line it prints.

    Use as a context manager around one cell; ``samples`` holds the parsed lines afterwards.
    """

    def __init__(self, executable: str, interval_ms: int = 100):
        self.executable = executable
        self.interval_ms = int(interval_ms)
        self.samples: list[TegraSample] = []
        self.error: str | None = None
        self._proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "TegrastatsSampler":
        try:
            self._proc = subprocess.Popen(
                [self.executable, "--interval", str(self.interval_ms)],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1,
            )
        except OSError as exc:
            self.error = f"cannot start tegrastats: {exc}"
            return self
        self._thread = threading.Thread(target=self._read, name="tegrastats-reader", daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.strip():
                self.samples.append(parse_tegrastats_line(line))

    def __exit__(self, *exc: object) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=2)
        if self._thread is not None:
            self._thread.join(timeout=2)

    def summary(self) -> dict[str, Any] | None:
        out = summarize_samples(self.samples)
        if out is None and self.error:
            return {"samples": 0, "error": self.error}
        return out
