# The shipped libraries must run on a machine with an NVIDIA driver and no CUDA toolkit. Run by
# ctest:
#   cmake -DREADELF=... -DNM=... -DLDD=... -DLIB=libtessera.so -DHARNESS=libtessera_harness.so -P shipped_deps.cmake
# Both libraries: no cuBLAS, CUPTI or CUDA runtime among what the loader must find (the runtime is
# linked statically; the harness opens cuBLAS and CUPTI when first used), and no absolute RPATH or
# RUNPATH. libtessera also carries no harness code (op descriptions, verify, CPU references, bench
# engine). Each check has a control that must match, so that a check which can no longer match
# anything (a tool's output changed, say) fails instead of passing: libc among the NEEDED, dlopen
# among the harness's undefined symbols, the harness code in the harness.
cmake_minimum_required(VERSION 3.24)

foreach(var READELF NM LIB HARNESS)
  if("${${var}}" STREQUAL "")
    message(FATAL_ERROR "shipped_deps.cmake: -D${var}=... not given")
  endif()
endforeach()

function(run out)
  execute_process(COMMAND ${ARGN} OUTPUT_VARIABLE text ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "`${ARGN}` failed (${rc}): ${err}")
  endif()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

# The lines of `text` that contain a match of `regex`. (Not through a CMake list: a line such as
# "Shared library: [libcudart.so]" would not split at its brackets.)
function(matching out text regex)
  string(REGEX MATCHALL "[^\n]*(${regex})[^\n]*" lines "${text}")
  set(${out} "${lines}" PARENT_SCOPE)
endfunction()

set(deps_re "[Cc][Uu][Bb][Ll][Aa][Ss]|[Cc][Uu][Pp][Tt][Ii]|libcudart")
# Demangled definitions that only harness sources provide.
set(harness_re "tessera::ops::all_ops\\(|tessera::ops::compare\\(|tessera::bench::|tessera::reference::")

set(failures "")
foreach(which LIB HARNESS)
  set(lib "${${which}}")
  run(dynamic ${READELF} -d --wide ${lib})
  matching(needed "${dynamic}" "\\(NEEDED\\)")
  matching(needed_deps "${dynamic}" "\\(NEEDED\\)[^\n]*(${deps_re})")
  matching(absolute_paths "${dynamic}" "\\((RPATH|RUNPATH)\\)[^\n]*[[:]/")
  run(undefined ${NM} -D --undefined-only ${lib})
  # Symbols by their own names ("U cudaMalloc"), not inside others' (throw_cuda's mangled name).
  matching(undefined_deps "${undefined}" "U +(cublas|cupti|cuda[A-Z])")
  set(ldd_deps "")
  if(LDD)
    run(ldd_out ${LDD} ${lib})
    matching(ldd_deps "${ldd_out}" "${deps_re}")
  endif()
  message(STATUS "${lib}: NEEDED ${needed}")
  foreach(found needed_deps absolute_paths undefined_deps ldd_deps)
    if(NOT "${${found}}" STREQUAL "")
      list(APPEND failures "${lib}: ${found}: ${${found}}")
    endif()
  endforeach()
  matching(libc "${needed}" "libc\\.so")
  if("${libc}" STREQUAL "")
    list(APPEND failures "control failed: no libc among the NEEDED of ${lib}")
  endif()
  run(defined ${NM} -D -C --defined-only ${lib})
  matching(harness_defs "${defined}" "${harness_re}")
  if(which STREQUAL "LIB" AND NOT "${harness_defs}" STREQUAL "")
    list(APPEND failures "libtessera carries harness code: ${harness_defs}")
  elseif(which STREQUAL "HARNESS" AND "${harness_defs}" STREQUAL "")
    list(APPEND failures "control failed: no harness code found in ${lib}")
  endif()
endforeach()
run(harness_undefined ${NM} -D --undefined-only ${HARNESS})
matching(dlopen "${harness_undefined}" "dlopen")
if("${dlopen}" STREQUAL "")
  list(APPEND failures "control failed: the harness does not use dlopen")
endif()

if(failures)
  string(REPLACE ";" "\n  " failures "${failures}")
  message(FATAL_ERROR "shipped library check failed:\n  ${failures}")
endif()
message(STATUS "libtessera and libtessera_harness need only the driver and the C++ runtime, carry "
               "no absolute RPATH, and libtessera carries no harness code")
