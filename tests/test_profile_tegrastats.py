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
* Three Orin device reports from public third-party repositories that could not be identified (so no
  citation: the output formats below are unconfirmed by a source a reader can open), quoted as recorded:
  - Orin NX, L4T R36.4.4 (nvidia-jetpack 6.2.1), `nvpmodel -q` and `jetson_clocks --show` with the
    clocks scaling (the L4T 36 format: "cpuN:  Online=1 Governor=...", "Active GPU TPCs");
  - AGX Orin, L4T R39.2.0, after jetson_clocks: every clock pinned, DLA/PVA lines; its logger wrote
    `nvpmodel -q` on one line ("NV Power Mode: MAXN 0");
  - Orin Nano Super, L4T R39.2.1 (nvidia-jetpack 7.2.1): `nvpmodel -q`, `jetson_clocks --show` and
    tegrastats lines whose rails print current/average/max and temperatures current/max.
"""

from __future__ import annotations

import pytest

from vitdeploy.profile.tegrastats import (
    describe_power_state,
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

# -- Orin records (third-party device reports, above) -----------------------------------------------------------
ORIN_NX_R3644_NVPMODEL = "NV Power Mode: MAXN_SUPER\n2\n"
ORIN_NX_R3644_CLOCKS = """SOC family:tegra234  Machine:NVIDIA Jetson Orin NX Engineering Reference Developer Kit
Online CPUs: 0-5
cpu0:  Online=1 Governor=schedutil MinFreq=729600 MaxFreq=1510400 CurrentFreq=1510400 IdleStates: WFI=1 c7=1 
cpu1:  Online=1 Governor=schedutil MinFreq=729600 MaxFreq=1510400 CurrentFreq=1497600 IdleStates: WFI=1 c7=1 
cpu2:  Online=1 Governor=schedutil MinFreq=729600 MaxFreq=1510400 CurrentFreq=1190400 IdleStates: WFI=1 c7=1 
cpu3:  Online=1 Governor=schedutil MinFreq=729600 MaxFreq=1510400 CurrentFreq=1113600 IdleStates: WFI=1 c7=1 
cpu4:  Online=1 Governor=schedutil MinFreq=729600 MaxFreq=1510400 CurrentFreq=729600 IdleStates: WFI=1 c7=1 
cpu5:  Online=1 Governor=schedutil MinFreq=729600 MaxFreq=1510400 CurrentFreq=883200 IdleStates: WFI=1 c7=1 
GPU MinFreq=306000000 MaxFreq=624750000 CurrentFreq=306000000
Active GPU TPCs: 2
EMC MinFreq=204000000 MaxFreq=2133000000 CurrentFreq=2133000000 FreqOverride=0
FAN Dynamic Speed Control=nvfancontrol hwmon0_pwm1=65
NV Power Mode: MAXN_SUPER
"""
AGX_ORIN_R392_NVPMODEL = "NV Power Mode: MAXN 0 "
AGX_ORIN_R392_CLOCKS = "\n".join(
    ["SOC family:tegra234  Machine:NVIDIA Jetson AGX Orin Developer Kit", "Online CPUs: 0-11, Offline CPUs: "]
    + [f"cpu{i}:{' ' if i > 9 else '  '}Governor=schedutil MinFreq=2201600 MaxFreq=2201600 CurrentFreq=2201600 "
       "IdleStates: WFI=0 c7=0 " for i in range(12)]
    + ["GPU MinFreq=1300500000 MaxFreq=1300500000 CurrentFreq=1300500000",
       "Active GPU TPCs: 8",
       "EMC MinFreq=3199000000 MaxFreq=3199000000 CurrentFreq=3199000000",
       "DLA0_CORE:   Online=1 MinFreq=0 MaxFreq=1600000000 CurrentFreq=1600000000",
       "DLA0_FALCON: Online=1 MinFreq=0 MaxFreq=844800000 CurrentFreq=844800000",
       "DLA1_CORE:   Online=1 MinFreq=0 MaxFreq=1600000000 CurrentFreq=1600000000",
       "DLA1_FALCON: Online=1 MinFreq=0 MaxFreq=844800000 CurrentFreq=844800000",
       "PVA0_VPS0: Online=1 MinFreq=0 MaxFreq=1369600000 CurrentFreq=1369600000",
       "PVA0_AXI:  Online=1 MinFreq=0 MaxFreq=985600000 CurrentFreq=985600000",
       "FAN Dynamic Speed Control=nvfancontrol hwmon2_pwm1=66",
       "FAN Dynamic Speed Control=nvfancontrol hwmon2_pwm1_enable=1",
       "NV Power Mode: MAXN", ""])
ORIN_NANO_R3921_NVPMODEL = "NV Power Mode: 25W\n1\n"
ORIN_NANO_R3921_CLOCKS = """SOC family:tegra234  Machine:NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super
Online CPUs: 0-5, Offline CPUs: 
cpu0:  Governor=schedutil MinFreq=729600 MaxFreq=1344000 CurrentFreq=960000 IdleStates: WFI=1 c7=1 
cpu1:  Governor=schedutil MinFreq=729600 MaxFreq=1344000 CurrentFreq=960000 IdleStates: WFI=1 c7=1 
cpu2:  Governor=schedutil MinFreq=729600 MaxFreq=1344000 CurrentFreq=1344000 IdleStates: WFI=1 c7=1 
cpu3:  Governor=schedutil MinFreq=729600 MaxFreq=1344000 CurrentFreq=1344000 IdleStates: WFI=1 c7=1 
cpu4:  Governor=schedutil MinFreq=729600 MaxFreq=1344000 CurrentFreq=1344000 IdleStates: WFI=1 c7=1 
cpu5:  Governor=schedutil MinFreq=729600 MaxFreq=1344000 CurrentFreq=1267200 IdleStates: WFI=1 c7=1 
GPU MinFreq=306000000 MaxFreq=918000000 CurrentFreq=306000000
Active GPU TPCs: 4
EMC MinFreq=204000000 MaxFreq=3199000000 CurrentFreq=665600000
FAN Dynamic Speed Control=nvfancontrol hwmon0_pwm1=60
FAN Dynamic Speed Control=nvfancontrol hwmon0_pwm1_enable=1
NV Power Mode: 25W
"""
ORIN_NANO_R3921_TEGRASTATS = [
    "09-19-2026 13:33:02 RAM 2850/7486MB (lfb 33x4MB) CPU [2%@729,0%@729,0%@729,0%@729,1%@729,0%@729] EMC_FREQ 5%@665 "
    "GR3D_FREQ 0%@[305] NVDEC0 off NVJPG0 off NVJPG1 off VIC off OFA off APE 200 cpu@45.812C/45.812C soc2@44.843C/44.843C "
    "soc0@46.093C/46.093C gpu@46.843C/46.843C tj@46.843C/46.843C soc1@46.281C/46.281C VDD_IN 3582mW/3582mW/3582mW "
    "VDD_CPU_GPU_CV 523mW/523mW/523mW VDD_SOC 1127mW/1127mW/1127mW",
    "09-19-2026 13:33:03 RAM 2845/7486MB (lfb 33x4MB) CPU [1%@729,0%@729,0%@729,0%@729,0%@729,0%@729] EMC_FREQ 3%@665 "
    "GR3D_FREQ 0%@[305] NVDEC0 off NVJPG0 off NVJPG1 off VIC off OFA off APE 200 cpu@45.375C/45.812C soc2@44.687C/44.843C "
    "soc0@46.25C/46.25C gpu@46.562C/46.843C tj@46.562C/46.843C soc1@46.281C/46.281C VDD_IN 3462mW/3522mW/3582mW "
    "VDD_CPU_GPU_CV 442mW/483mW/523mW VDD_SOC 1127mW/1127mW/1127mW",
]


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
    assert state["clocks"]["cpu0"] == {"min": 1734000, "max": 1734000, "current": 1734000, "governor": "interactive"}
    assert state["clocks"]["EMC"]["max"] == 1600000000
    assert state["emc_pinned"] is True  # not min == max on the TX1: FreqOverride=1 pins it
    assert (state["active_gpu_tpcs"], state["power_mode"]) == (None, None)
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


def test_orin_nx_l4t36_clocks_scaling():
    state = parse_jetson_clocks_show(ORIN_NX_R3644_CLOCKS)
    assert state["locked"] is False and state["unpinned"] == [f"cpu{i}" for i in range(6)] + ["GPU"]
    assert state["clocks"]["cpu0"] == {"min": 729600, "max": 1510400, "current": 1510400, "online": True, "governor": "schedutil"}
    assert state["clocks"]["GPU"] == {"min": 306000000, "max": 624750000, "current": 306000000}
    # EMC runs at its maximum here, but it is not pinned: min 204 MHz, FreqOverride=0
    assert state["emc_pinned"] is False and state["clocks"]["EMC"]["freq_override"] is False
    assert (state["active_gpu_tpcs"], state["online_cpus"], state["power_mode"]) == (2, "0-5", "MAXN_SUPER")
    assert parse_nvpmodel_query(ORIN_NX_R3644_NVPMODEL) == {"name": "MAXN_SUPER", "id": 2}
    line = describe_power_state({"nvpmodel": parse_nvpmodel_query(ORIN_NX_R3644_NVPMODEL), "jetson_clocks": state})
    assert line == "nvpmodel MAXN_SUPER, clocks not locked (cpu0, cpu1, cpu2, cpu3, cpu4, cpu5, GPU still scale), " \
                   "EMC not pinned, 2 GPU TPCs active"


def test_agx_orin_l4t39_after_jetson_clocks_is_locked():
    state = parse_jetson_clocks_show(AGX_ORIN_R392_CLOCKS)
    assert state["locked"] is True and state["unpinned"] == [] and state["emc_pinned"] is True
    assert len([n for n in state["clocks"] if n.startswith("cpu")]) == 12  # "cpu10: Governor" has one space
    assert state["clocks"]["DLA0_CORE"] == {"min": 0, "max": 1600000000, "current": 1600000000, "online": True}
    assert {"DLA1_CORE", "DLA1_FALCON", "PVA0_VPS0", "PVA0_AXI"} <= set(state["clocks"])
    assert (state["active_gpu_tpcs"], state["online_cpus"], state["power_mode"]) == (8, "0-11", "MAXN")
    # its logger put the mode and its id on one line
    assert parse_nvpmodel_query(AGX_ORIN_R392_NVPMODEL) == {"name": "MAXN", "id": 0}
    line = describe_power_state({"nvpmodel": {"name": "MAXN", "id": 0}, "jetson_clocks": state})
    assert line == "nvpmodel MAXN, jetson_clocks locked, 8 GPU TPCs active"


def test_orin_nano_super_l4t39_power_state_and_tegrastats():
    state = parse_jetson_clocks_show(ORIN_NANO_R3921_CLOCKS)
    assert state["locked"] is False and state["emc_pinned"] is False
    assert (state["active_gpu_tpcs"], state["power_mode"], state["clocks"]["GPU"]["max"]) == (4, "25W", 918000000)
    assert parse_nvpmodel_query(ORIN_NANO_R3921_NVPMODEL) == {"name": "25W", "id": 1}
    first, second = (parse_tegrastats_line(line) for line in ORIN_NANO_R3921_TEGRASTATS)
    assert (first.timestamp, first.ram_used_mb, first.ram_total_mb, first.ram_lfb_blocks) == ("09-19-2026 13:33:02", 2850, 7486, 33)
    assert first.cpu_load_pct == [2, 0, 0, 0, 1, 0] and first.cpu_freq_mhz == [729] * 6
    assert (first.emc_load_pct, first.emc_freq_mhz, first.gpu_load_pct, first.gpu_freq_mhz) == (5, 665, 0, [305])
    # rails print current/average/max (3462/3522/3582: the average of 3582 and 3462); the parser keeps current, average
    assert second.rails_mw == {"VDD_IN": (3462, 3522), "VDD_CPU_GPU_CV": (442, 483), "VDD_SOC": (1127, 1127)}
    assert second.input_power_mw == 3462
    # temperatures print current/max: the current reading is kept
    assert second.temps_c == {"cpu": 45.375, "soc2": 44.687, "soc0": 46.25, "gpu": 46.562, "tj": 46.562, "soc1": 46.281}
    assert "NVDEC0" not in second.rails_mw and "APE" not in second.rails_mw
    summary = summarize_samples([first, second])
    assert summary["input_power_mw_mean"] == pytest.approx(3522) and summary["ram_used_mb_max"] == 2850
