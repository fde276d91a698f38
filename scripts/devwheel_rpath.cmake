# cmake -P scripts/devwheel_rpath.cmake: the torch ops library staged in devwheel/ finds tessera's
# libraries next to it, as the installed one does (scripts/devwheel.sh).
file(RPATH_SET FILE devwheel/libtessera_torch.so NEW_RPATH "$ORIGIN")
