# Compiler flags shared by every target (STYLE.md 21).
set(SLUICE_WARNINGS -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-declarations
    -Wno-unused-parameter -Wno-format-truncation)
if(SLUICE_WERROR)
  list(APPEND SLUICE_WARNINGS -Werror)
endif()
add_compile_options(${SLUICE_WARNINGS})
# No fused multiply-adds the source does not write: a scalar reference and its
# SIMD twin (built with -mfma) must round alike. GCC's ISO C mode already does
# this; clang would fuse a*b+c by default.
add_compile_options(-ffp-contract=off)
add_compile_definitions(_GNU_SOURCE _FILE_OFFSET_BITS=64)

if(SLUICE_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-sanitize-recover=undefined
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
endif()
if(SLUICE_TSAN)
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
endif()

# Which SIMD kernel files this target architecture can compile. Each kernel
# file gets its own -m flags (set_source_files_properties); nothing else in
# the tree is built for more than the baseline ISA (no -march=native).
set(SLUICE_X86 OFF)
set(SLUICE_ARM64 OFF)
if(NOT SLUICE_NATIVE_ONLY)
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64")
    set(SLUICE_X86 ON)
  elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "aarch64|arm64")
    set(SLUICE_ARM64 ON)
  endif()
endif()
set(SLUICE_FLAGS_AVX2 "-mavx2 -mfma -mf16c -mbmi2")
set(SLUICE_FLAGS_AVX512 "-mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -mf16c -mbmi2")
set(SLUICE_FLAGS_AVX512VNNI "${SLUICE_FLAGS_AVX512} -mavx512vnni")
set(SLUICE_FLAGS_AVXVNNI "-mavx2 -mfma -mavxvnni")
# AMX (tile registers, TDPBSSD): GCC 11 / clang 12 and later; without the
# flags the AMX kernel is left out and the VNNI kernels remain.
set(SLUICE_FLAGS_AMX "${SLUICE_FLAGS_AVX512VNNI} -mamx-tile -mamx-int8")
set(SLUICE_AMX OFF)
if(SLUICE_X86)
  include(CheckCCompilerFlag)
  check_c_compiler_flag("-mamx-tile -mamx-int8" SLUICE_CC_HAS_AMX)
  if(SLUICE_CC_HAS_AMX)
    set(SLUICE_AMX ON)
  endif()
endif()

# libFuzzer builds instrument every library for coverage (clang only).
if(SLUICE_FUZZ)
  add_compile_options(-fsanitize=fuzzer-no-link)
  add_compile_definitions(FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION)
endif()
