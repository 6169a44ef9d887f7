# Parquet and Arrow IPC input (issue 41): Apache Arrow's C++ libraries, taken from the
# pyarrow wheel that scripts/setup_arrow.sh installs at a pinned version (Debian 12
# packages no libarrow or libparquet). DUFU_ARROW_PYTHON names that environment's
# python (scripts/build.sh passes it); without it, or with another pyarrow, the build
# has no Parquet or Arrow input and says so in one line, and `dataprep preprocess`
# refuses such inputs naming what is missing. Defines dufu::arrow and dufu::parquet
# (imported shared libraries, headers as system headers) and DUFU_HAVE_ARROW.
set(DUFU_PARQUET AUTO CACHE STRING "Parquet and Arrow IPC input: AUTO, ON or OFF")
set_property(CACHE DUFU_PARQUET PROPERTY STRINGS AUTO ON OFF)
set(DUFU_ARROW_PYTHON "" CACHE FILEPATH "python of the environment with pyarrow (scripts/setup_arrow.sh)")
set(DUFU_ARROW_VERSION "22.0.0")  # scripts/setup_arrow.sh's pin
set(DUFU_HAVE_ARROW OFF)
set(DUFU_ARROW_MISSING "")

if(DUFU_PARQUET STREQUAL "OFF")
  set(DUFU_ARROW_MISSING "configured with -DDUFU_PARQUET=OFF")
elseif(DUFU_SANITIZE_THREAD)
  # Arrow's libraries are not built with ThreadSanitizer: their threads would be
  # reported, not ours.
  set(DUFU_ARROW_MISSING "the ThreadSanitizer build leaves it out")
elseif(NOT DUFU_ARROW_PYTHON)
  set(DUFU_ARROW_MISSING "configured without DUFU_ARROW_PYTHON")
else()
  execute_process(
    COMMAND "${DUFU_ARROW_PYTHON}" -c
            "import pyarrow; print(pyarrow.__version__); print(pyarrow.get_include()); print(pyarrow.get_library_dirs()[0])"
    OUTPUT_VARIABLE arrow_facts RESULT_VARIABLE arrow_status ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT arrow_status EQUAL 0)
    set(DUFU_ARROW_MISSING "${DUFU_ARROW_PYTHON} cannot import pyarrow: run scripts/setup_arrow.sh")
  else()
    string(REPLACE "\n" ";" arrow_facts "${arrow_facts}")
    list(GET arrow_facts 0 arrow_version)
    list(GET arrow_facts 1 arrow_include)
    list(GET arrow_facts 2 arrow_library_dir)
    string(REPLACE "." ";" version_parts "${DUFU_ARROW_VERSION}")
    list(GET version_parts 0 major)
    math(EXPR soversion "${major} * 100")
    set(arrow_library "${arrow_library_dir}/libarrow.so.${soversion}")
    set(parquet_library "${arrow_library_dir}/libparquet.so.${soversion}")
    if(NOT arrow_version VERSION_EQUAL DUFU_ARROW_VERSION)
      set(DUFU_ARROW_MISSING "pyarrow ${arrow_version} at ${DUFU_ARROW_PYTHON}, not ${DUFU_ARROW_VERSION}: run scripts/setup_arrow.sh")
    elseif(NOT EXISTS "${arrow_library}" OR NOT EXISTS "${parquet_library}" OR NOT EXISTS "${arrow_include}/parquet/arrow/reader.h")
      set(DUFU_ARROW_MISSING "pyarrow ${arrow_version} at ${arrow_library_dir} lacks libarrow.so.${soversion}, libparquet.so.${soversion} or its headers")
    else()
      set(DUFU_HAVE_ARROW ON)
      add_library(dufu::arrow SHARED IMPORTED)
      # An imported target's headers are system headers: Arrow's own warnings stay out
      # of -Werror.
      set_target_properties(dufu::arrow PROPERTIES IMPORTED_LOCATION "${arrow_library}"
                            INTERFACE_INCLUDE_DIRECTORIES "${arrow_include}")
      add_library(dufu::parquet SHARED IMPORTED)
      set_target_properties(dufu::parquet PROPERTIES IMPORTED_LOCATION "${parquet_library}"
                            INTERFACE_LINK_LIBRARIES dufu::arrow)
      message(STATUS "dufu: Parquet and Arrow input with pyarrow ${arrow_version}'s libraries in ${arrow_library_dir}")
    endif()
  endif()
endif()

if(NOT DUFU_HAVE_ARROW)
  if(DUFU_PARQUET STREQUAL "ON")
    message(FATAL_ERROR "DUFU_PARQUET=ON but ${DUFU_ARROW_MISSING}")
  endif()
  message(STATUS "dufu: no Parquet or Arrow input (${DUFU_ARROW_MISSING})")
endif()
