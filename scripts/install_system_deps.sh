#!/usr/bin/env bash
# Debian/Ubuntu packages the C++ example's library tests need (tests/test_cpp_example.py):
# a compiler, CMake, and the header libraries the example builds on; and OpenSSH for the `--on HOST`
# round-trip tests (tests/test_remote.py); Chromium and its driver for the report page's browser test
# (tests/test_report_browser.py). Idempotent: installs only what
# is missing, and does nothing (not even `apt-get update`) when everything is already there.
#
#   bash scripts/install_system_deps.sh          # install what is missing (root, or sudo)
#   bash scripts/install_system_deps.sh --check  # list what is missing; exit 1 if anything is
set -euo pipefail

PACKAGES=(
    cmake                # build system of examples/cpp
    g++                  # C++17 compiler
    make                 # CMake's default generator
    pkg-config           # how CMake finds libexif
    nlohmann-json3-dev   # manifest.json / engine.json reading
    libstb-dev           # stb_image (decode) + stb_image_resize (the host resize rule)
    libexif-dev          # EXIF orientation, so C++ rotates photos like the Python side does
    libssl-dev           # OpenSSL's sha256: C++ checks a graph or plan against its recorded digest before it runs
    openssh-client       # `--on HOST`: ssh to the device (tests/test_remote.py)
    openssh-server       # tests/test_remote.py starts its own sshd on 127.0.0.1 as the "device" (not as a service)
    chromium             # tests/test_report_browser.py opens `vitdeploy report`'s page headless, offline
    chromium-driver      # its WebDriver, driven by Selenium (the dev extra)
)

missing=()
for pkg in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    if [[ "$status" != "install ok installed" ]]; then
        missing+=("$pkg")
    fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
    echo "system deps: all present (${PACKAGES[*]})"
    exit 0
fi

if [[ "${1:-}" == "--check" ]]; then
    echo "system deps missing: ${missing[*]}" >&2
    exit 1
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "system deps missing: ${missing[*]}; this is not a Debian/Ubuntu system, install their equivalents by hand" >&2
    exit 1
fi

if [[ $(id -u) -eq 0 ]]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
else
    echo "system deps missing: ${missing[*]}; run: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
fi

echo "system deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "system deps: installed ${missing[*]}"
