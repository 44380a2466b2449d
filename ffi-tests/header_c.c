/* The header compiles on its own as C11 (with -Wall -Wextra -Werror -pedantic). */
#include "ple.h"
#include "ple.h" /* include guard */
int ple_header_c_compiles(void) { return PLE_OK + (int)sizeof(ple_batch); }
