# cmake -DF=devwheel/pkg/x.so -P dev/devwheel_rpath.cmake: a library staged for the device
# (dev/stage_devpkg.sh) finds tessera's libraries next to it, as the installed one does.
file(RPATH_SET FILE "${F}" NEW_RPATH "$ORIGIN")
