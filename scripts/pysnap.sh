# Runs the Python steps from snap/ (a snapshot of HEAD), so that files being edited in the working
# tree do not reach the build.
cd snap
cp -r ../devbin . 2>/dev/null
bash scripts/device.sh pyinstall pytest $@
