# Writes libple's CMake package version file with CMake's own write_basic_package_version_file
# (run by scripts/install.sh):
#   cmake -DPLE_VERSION=0.3.0 -DOUT=<prefix>/lib/cmake/ple/pleConfigVersion.cmake -P cmake/pleConfigVersion.cmake
# Compatibility: SameMinorVersion while at 0.x (the ABI may change with the minor version),
# SameMajorVersion from 1.0 on. libple is built for 64-bit targets only, so a 32-bit consumer is
# told the package is unsuitable.
cmake_minimum_required(VERSION 3.19)
if(NOT PLE_VERSION OR NOT OUT)
  message(FATAL_ERROR "usage: cmake -DPLE_VERSION=X.Y.Z -DOUT=<file> -P ${CMAKE_CURRENT_LIST_FILE}")
endif()
include(CMakePackageConfigHelpers)
string(REGEX MATCH "^[0-9]+" _ple_major "${PLE_VERSION}")
if(_ple_major STREQUAL "0")
  set(_ple_compat SameMinorVersion)
else()
  set(_ple_compat SameMajorVersion)
endif()
# (script mode knows no target: the check against the consumer's pointer size uses ours)
set(CMAKE_SIZEOF_VOID_P 8)
write_basic_package_version_file("${OUT}" VERSION "${PLE_VERSION}" COMPATIBILITY ${_ple_compat})
