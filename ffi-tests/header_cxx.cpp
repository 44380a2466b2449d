// The headers compile on their own as C++: ple.h declares its functions extern "C", and
// ple-cpp.h (the C++ layer) needs nothing included before it.
#include "ple-cpp.h"
#include "ple-cpp.h"
#include "ple.h"
#include "ple.h"
#include <type_traits>
static_assert(std::is_same<decltype(&ple_open), ple_status (*)(const char *, const ple_options *, ple_handle **)>::value,
              "ple_open has C linkage and the documented signature");
static_assert(std::is_same<ple_handle_ptr::deleter_type, ple_handle_deleter>::value &&
                  sizeof(ple_handle_ptr) == sizeof(ple_handle *),
              "ple_handle_ptr is a unique_ptr with an empty deleter: as small as the raw pointer");
int ple_header_cxx_compiles() { return PLE_OK + static_cast<int>(sizeof(ple_options)); }
