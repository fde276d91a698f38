#!/usr/bin/env bash
# Device run of the Python steps from snap/, a snapshot of HEAD (`git archive HEAD | tar -x -C snap`,
# carried with devbin/), so that files still being edited in the working tree do not reach the
# package build:  bash dev/pysnap.sh [more device.sh steps]   (always pyinstall and pytest first)
set -uo pipefail
cd "$(dirname "$0")/../snap"
cp -r ../devbin . 2>/dev/null
bash dev/device.sh pyinstall pytest "$@"
