"""The tegrastats / nvpmodel / jetson_clocks parsers on real output, quoted with its source.

Sources (quoted verbatim):

* NVIDIA, "Tegra Linux Driver Package Development Guide 32.5, tegrastats Utility" (the per-field
  examples of the statistics table):
  https://docs.nvidia.com/jetson/archives/l4t-archived/l4t-325/Tegra%20Linux%20Driver%20Package%20Development%20Guide/AppendixTegraStats.html
  The search corpus holds only that table's opening rows (RAM, SWAP, IRAM, CPU); NVIDIA's pages
  reached here print no complete line, so complete lines come from the two captures below.
* jetson-stats (rbonghi), tegrastats emulator with example lines from a Jetson Nano and a Jetson
  AGX Xavier: https://github.com/rbonghi/jetson_stats/blob/master/tests/tegrastats
* hordiales/jetson-tx1-dev, lines from a Jetson TX1 (L4T 28.1, old format) and its
  `jetson_clocks.sh --show`: https://github.com/hordiales/jetson-tx1-dev/blob/master/SCRIPTS.md
"""

from __future__ import annotations

import pytest

from vitdeploy.profile.tegrastats import (
    jetson_power_state,
    parse_jetson_clocks_show,
    parse_nvpmodel_query,
    parse_tegrastats_line,
    summarize_samples,
)

# -- NVIDIA L4T 32.5 documentation, one example per statistic -------------------------------------
NVIDIA_RAM = "RAM 220/38955MB (lfb 847x4MB)"
NVIDIA_SWAP = "SWAP 0/1978MB (cached 0MB)"
NVIDIA_IRAM = "IRAM 0/252kB(lfb 252kB)"
NVIDIA_CPU = "CPU [1%@102,5%@102,0%@102,0%@102]"

# -- jetson-stats tests/tegrastats ------------------------------------------------------------------
NANO = (
    "RAM 1180/3965MB (lfb 1x2MB) SWAP 149/1024MB (cached 7MB) IRAM 0/252kB(lfb 252kB) "
    "CPU [30%@1036,33%@1036,28%@1036,26%@1036] EMC_FREQ 10%@1600 GR3D_FREQ 0%@76 NVENC 716 NVDEC 716 APE 25 "
    "PLL@57C CPU@60.5C PMIC@100C GPU@59C AO@65C thermal@59.75C POM_5V_IN 4520/4680 POM_5V_GPU 0/0 POM_5V_CPU 1078/1205"
)
# The emulator prints this line with "$RAND_GPU" (a random number) as the GPU load; 42 stands in for it.
XAVIER = (
    "RAM 4722/7844MB (lfb 1x512kB) CPU [55%@2035,14%@2034,27%@2034,55%@2035,47%@2035,45%@2035] "
    "SWAP 149/1024MB (cached 7MB) EMC_FREQ 2%@1866 GR3D_FREQ $RAND_GPU%@1300 APE 150 MTS fg 0% bg 0% "
    "BCPU@-45C MCPU@-45C GPU@-51C PLL@45C AO@47.5C Tboard@37C Tdiode@46.75C PMIC@100C thermal@46.4C "
    "VDD_IN 14025/14416 VDD_CPU 2209/2538 VDD_GPU 6854/6903 VDD_SOC 1371/1370 VDD_WIFI 19/19 NVENC 716 NVDEC 716 "
    "VDD_DDR 2702/2702"
).replace("$RAND_GPU", "42")

# -- hordiales/jetson-tx1-dev SCRIPTS.md (TX1, L4T 28.1) ------------------------------------------
TX1_IDLE = "RAM 3468/3983MB (lfb 48x4MB) SWAP 873/8192MB (cached 295MB) cpu [17%,13%,29%,5%]@408 EMC 1%@408 APE 25 GR3D 3%@76"
TX1_BUSY = "RAM 3607/3983MB (lfb 47x4MB) SWAP 873/8192MB (cached 281MB) cpu [17%,11%,65%,0%]@1734 EMC 1%@1600 APE 25 GR3D 39%@76"
TX1_CLOCKS = """SOC family:tegra210  Machine:jetson_tx1
Online CPUs: 0-3
CPU Cluster Switching: Disabled
cpu0: Gonvernor=interactive MinFreq=1734000 MaxFreq=1734000 CurrentFreq=1734000
cpu1: Gonvernor=interactive MinFreq=1734000 MaxFreq=1734000 CurrentFreq=1734000
cpu2: Gonvernor=interactive MinFreq=1734000 MaxFreq=1734000 CurrentFreq=1734000
cpu3: Gonvernor=interactive MinFreq=1734000 MaxFreq=1734000 CurrentFreq=1734000
GPU MinFreq=998400000 MaxFreq=998400000 CurrentFreq=998400000
EMC MinFreq=12750000 MaxFreq=1600000000 CurrentFreq=1600000000 FreqOverride=1
Fan: speed=255
"""


def test_nvidia_documented_fields():
    ram = parse_tegrastats_line(NVIDIA_RAM)
    assert (ram.ram_used_mb, ram.ram_total_mb, ram.ram_lfb_blocks, ram.ram_lfb_block_mb) == (220, 38955, 847, 4)
    swap = parse_tegrastats_line(NVIDIA_SWAP)
    assert (swap.swap_used_mb, swap.swap_total_mb, swap.swap_cached_mb) == (0, 1978, 0)
    iram = parse_tegrastats_line(NVIDIA_IRAM)
    assert (iram.iram_used_kb, iram.iram_total_kb, iram.iram_lfb_kb) == (0, 252, 252)
    cpu = parse_tegrastats_line(NVIDIA_CPU)
    assert cpu.cpu_load_pct == [1, 5, 0, 0] and cpu.cpu_freq_mhz == [102] * 4
    # The whole documented set on one line parses to the same values (fields are independent).
    joined = parse_tegrastats_line(" ".join([NVIDIA_RAM, NVIDIA_SWAP, NVIDIA_IRAM, NVIDIA_CPU]))
    assert (joined.ram_used_mb, joined.swap_total_mb, joined.iram_total_kb, joined.cpu_load_pct) == (220, 1978, 252, [1, 5, 0, 0])
    assert joined.rails_mw == {} and joined.temps_c == {}  # "220/38955MB" is memory, not a power rail


def test_jetson_nano_line():
    s = parse_tegrastats_line(NANO)
    assert (s.ram_used_mb, s.ram_total_mb, s.ram_lfb_blocks, s.ram_lfb_block_mb) == (1180, 3965, 1, 2)
    assert (s.swap_used_mb, s.swap_total_mb, s.swap_cached_mb) == (149, 1024, 7)
    assert s.cpu_load_pct == [30, 33, 28, 26] and s.cpu_freq_mhz == [1036] * 4
    assert (s.emc_load_pct, s.emc_freq_mhz) == (10, 1600)
    assert (s.gpu_load_pct, s.gpu_freq_mhz) == (0, [76])
    assert s.temps_c == {"PLL": 57.0, "CPU": 60.5, "PMIC": 100.0, "GPU": 59.0, "AO": 65.0, "thermal": 59.75}
    assert s.rails_mw == {"POM_5V_IN": (4520, 4680), "POM_5V_GPU": (0, 0), "POM_5V_CPU": (1078, 1205)}
    assert s.input_power_mw == 4520  # the Nano's whole-module rail is POM_5V_IN


def test_jetson_xavier_line():
    s = parse_tegrastats_line(XAVIER)
    assert (s.ram_used_mb, s.ram_total_mb, s.ram_lfb_blocks) == (4722, 7844, 1)
    assert s.ram_lfb_block_mb == pytest.approx(0.5)  # "1x512kB"
    assert s.cpu_load_pct == [55, 14, 27, 55, 47, 45] and s.cpu_freq_mhz == [2035, 2034, 2034, 2035, 2035, 2035]
    assert (s.gpu_load_pct, s.gpu_freq_mhz) == (42, [1300])
    assert s.temps_c["BCPU"] == -45.0 and s.temps_c["Tdiode"] == 46.75  # negative readings parse
    assert s.rails_mw["VDD_IN"] == (14025, 14416) and s.rails_mw["VDD_DDR"] == (2702, 2702)
    assert set(s.rails_mw) == {"VDD_IN", "VDD_CPU", "VDD_GPU", "VDD_SOC", "VDD_WIFI", "VDD_DDR"}
    assert s.input_power_mw == 14025


def test_old_tx1_format_and_summary():
    idle, busy = parse_tegrastats_line(TX1_IDLE), parse_tegrastats_line(TX1_BUSY)
    assert idle.cpu_load_pct == [17, 13, 29, 5] and idle.cpu_freq_mhz == [408] * 4
    assert (idle.emc_load_pct, idle.emc_freq_mhz, idle.gpu_load_pct, idle.gpu_freq_mhz) == (1, 408, 3, [76])
    assert (busy.gpu_load_pct, busy.cpu_freq_mhz[0], busy.ram_used_mb) == (39, 1734, 3607)
    summary = summarize_samples([idle, busy])
    assert summary["samples"] == 2
    assert summary["ram_used_mb_max"] == 3607 and summary["ram_total_mb"] == 3983
    assert summary["gpu_load_pct_mean"] == pytest.approx(21.0) and summary["gpu_load_pct_max"] == 39
    assert summary["cpu_freq_mhz_max"] == 1734
    assert "rails_mw" not in summary  # this board printed none
    nano = summarize_samples([parse_tegrastats_line(NANO), parse_tegrastats_line(NANO)])
    assert nano["input_power_mw_mean"] == 4520 and nano["rails_mw"]["POM_5V_CPU"] == {"mean_mw": 1078, "max_mw": 1078}
    assert nano["temps_c_max"]["CPU"] == 60.5
    assert summarize_samples([]) is None


def test_jetson_clocks_show_tx1_is_locked():
    state = parse_jetson_clocks_show(TX1_CLOCKS)
    assert state["locked"] is True  # every CPU and the GPU at min == max
    assert state["clocks"]["cpu0"] == {"min": 1734000, "max": 1734000, "current": 1734000}
    assert state["clocks"]["EMC"]["max"] == 1600000000
    unlocked = TX1_CLOCKS.replace("GPU MinFreq=998400000", "GPU MinFreq=76800000")
    assert parse_jetson_clocks_show(unlocked)["locked"] is False
    assert parse_jetson_clocks_show("jetson_clocks: permission denied") is None


def test_nvpmodel_query():
    # `nvpmodel -q` prints the mode name, then its id on the next line (see jetson-stats tests/nvpmodel).
    assert parse_nvpmodel_query("NV Power Mode: MAXN\n0\n") == {"name": "MAXN", "id": 0}
    assert parse_nvpmodel_query("NV Power Mode: MODE_15W\n2\n") == {"name": "MODE_15W", "id": 2}
    assert parse_nvpmodel_query("command not found") is None


def test_no_jetson_tools_here_means_no_state():
    import shutil

    if any(shutil.which(t) for t in ("tegrastats", "nvpmodel", "jetson_clocks")):
        pytest.skip("this machine has Jetson tools")
    assert jetson_power_state() is None
