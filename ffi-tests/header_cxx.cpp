// The header compiles on its own as C++ and declares its functions extern "C".
#include "ple.h"
#include "ple.h"
#include <type_traits>
static_assert(std::is_same<decltype(&ple_open), ple_status (*)(const char *, const ple_options *, ple_handle **)>::value,
              "ple_open has C linkage and the documented signature");
int ple_header_cxx_compiles() { return PLE_OK + static_cast<int>(sizeof(ple_options)); }
