# Debian 12 packages (installed by scripts/install-deps.sh).
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
pkg_check_modules(FUSE3 REQUIRED IMPORTED_TARGET fuse3)
pkg_check_modules(URING REQUIRED IMPORTED_TARGET liburing)
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
pkg_check_modules(CJSON REQUIRED IMPORTED_TARGET libcjson)
pkg_check_modules(MHD REQUIRED IMPORTED_TARGET libmicrohttpd)
pkg_check_modules(CURL REQUIRED IMPORTED_TARGET libcurl)
# libxxhash-dev ships a .pc file on Debian 12.
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
pkg_check_modules(CMOCKA IMPORTED_TARGET cmocka)

# The cold start reads the binary and each shared library it needs from a
# cold disk (issue 22): liburing, libfuse3, libxxhash and libzstd are linked
# from the static archives their Debian -dev packages ship, where found (one
# file for the loader to open and fault in instead of five: a cold
# `sluice --version` issues 2-3 block reads instead of 6-7). libcjson has no
# archive and stays shared. SLUICE_STATIC_DEPS=OFF links all of them shared.
option(SLUICE_STATIC_DEPS "link liburing, libfuse3, libxxhash, libzstd from their static archives where found" ON)
if(SLUICE_STATIC_DEPS)
  foreach(dep FUSE3:fuse3 URING:uring ZSTD:zstd XXHASH:xxhash)
    string(REPLACE ":" ";" dep "${dep}")
    list(GET dep 0 prefix)
    list(GET dep 1 name)
    # only beside the shared library pkg-config resolved (not a stray
    # /usr/local archive against /usr/include headers)
    set(dirs ${${prefix}_LIBRARY_DIRS})
    foreach(so IN LISTS ${prefix}_LINK_LIBRARIES)
      get_filename_component(d "${so}" DIRECTORY)
      list(APPEND dirs "${d}")
    endforeach()
    find_library(SLUICE_${prefix}_ARCHIVE NAMES lib${name}.a PATHS ${dirs} NO_DEFAULT_PATH)
    if(SLUICE_${prefix}_ARCHIVE AND EXISTS "${SLUICE_${prefix}_ARCHIVE}")
      # the archive, then what pkg-config --static says it needs besides itself
      set(libs ${SLUICE_${prefix}_ARCHIVE})
      foreach(lib IN LISTS ${prefix}_STATIC_LIBRARIES)
        if(NOT lib STREQUAL name)
          list(APPEND libs ${lib})
        endif()
      endforeach()
      set_property(TARGET PkgConfig::${prefix} PROPERTY INTERFACE_LINK_LIBRARIES ${libs})
      message(STATUS "sluice: lib${name} linked statically (${SLUICE_${prefix}_ARCHIVE})")
    else()
      message(STATUS "sluice: no lib${name}.a; lib${name} linked shared")
    endif()
  endforeach()
endif()
