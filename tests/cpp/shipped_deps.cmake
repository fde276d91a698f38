# The shipped library (libtessera) must need neither cuBLAS nor CUPTI and carry no harness code
# (op descriptions, verify, CPU references, bench engine). Run by ctest:
#   cmake -DREADELF=... -DNM=... -DLDD=... -DLIB=libtessera.so -DHARNESS=libtessera_harness.so -P shipped_deps.cmake
# The harness is the control: the same commands must find cuBLAS, CUPTI and the harness code in
# it, so that a check which can no longer match anything (a tool's output changed, say) fails
# instead of passing.
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

set(deps_re "[Cc][Uu][Bb][Ll][Aa][Ss]|[Cc][Uu][Pp][Tt][Ii]")
# Demangled definitions that only harness sources provide.
set(harness_re "tessera::ops::all_ops\\(|tessera::ops::compare\\(|tessera::bench::|tessera::reference::")

set(failures "")
foreach(which LIB HARNESS)
  run(dynamic ${READELF} -d --wide ${${which}})
  matching(needed "${dynamic}" "\\(NEEDED\\)")
  matching(needed_deps "${dynamic}" "\\(NEEDED\\)[^\n]*(${deps_re})")
  run(undefined ${NM} -D --undefined-only ${${which}})
  matching(undefined_deps "${undefined}" "${deps_re}")
  run(defined ${NM} -D -C --defined-only ${${which}})
  matching(harness_defs "${defined}" "${harness_re}")
  set(ldd_deps "")
  if(LDD)
    run(ldd_out ${LDD} ${${which}})
    matching(ldd_deps "${ldd_out}" "${deps_re}")
  endif()
  if(which STREQUAL "LIB")
    message(STATUS "${LIB}: NEEDED ${needed}")
    foreach(found needed_deps undefined_deps ldd_deps harness_defs)
      if(NOT "${${found}}" STREQUAL "")
        list(APPEND failures "libtessera: ${found}: ${${found}}")
      endif()
    endforeach()
  else()
    # The control: each check finds what it looks for where it is known to be.
    foreach(found needed_deps undefined_deps harness_defs)
      if("${${found}}" STREQUAL "")
        list(APPEND failures "control failed: ${found} found nothing in ${HARNESS}")
      endif()
    endforeach()
  endif()
endforeach()

if(failures)
  string(REPLACE ";" "\n  " failures "${failures}")
  message(FATAL_ERROR "shipped library check failed:\n  ${failures}")
endif()
message(STATUS "libtessera needs no cuBLAS or CUPTI and carries no harness code")
