# The server's request parser as a fuzz target (issue 19), as
# tests/fuzz/CMakeLists.txt does for the container reader: replayed in ctest
# by fuzz_serve_driver; with -DSLUICE_FUZZ=ON and clang, also a libFuzzer
# binary. Included from tests/tools/CMakeLists.txt (the parser lives in tools/).
set(SERVE_FUZZ_SOURCES ${CMAKE_SOURCE_DIR}/tools/serve_req.c ${CMAKE_SOURCE_DIR}/tools/serve_text.c)
sluice_test(NAME fuzz_serve_req_replay
            SOURCES ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_serve_driver.c
                    ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_serve_req.c ${SERVE_FUZZ_SOURCES}
            LIBS PkgConfig::CJSON ARGS --mutations 2000)
target_include_directories(fuzz_serve_req_replay PRIVATE ${CMAKE_SOURCE_DIR}/tools)
if(SLUICE_FUZZ)
  add_executable(fuzz_serve_req ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_serve_req.c ${SERVE_FUZZ_SOURCES})
  target_include_directories(fuzz_serve_req PRIVATE ${CMAKE_SOURCE_DIR}/tools)
  target_compile_options(fuzz_serve_req PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(fuzz_serve_req PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_serve_req PRIVATE sluice_common PkgConfig::CJSON)
endif()
