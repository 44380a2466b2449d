/* The library's version, the header's defines and the ABI number agree. */
#include "check.h"

int main(void) {
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", PLE_VERSION_MAJOR, PLE_VERSION_MINOR, PLE_VERSION_PATCH);
    const char *v = ple_version_string();
    CHECK(v != NULL);
    CHECK(v != NULL && strcmp(v, want) == 0);
    CHECK(ple_abi_version() == (uint32_t)PLE_ABI_VERSION);
    CHECK(PLE_ABI_VERSION == PLE_VERSION_MAJOR * 10000 + PLE_VERSION_MINOR * 100 + PLE_VERSION_PATCH);
    CHECK(strcmp(ple_status_name(PLE_OK), "PLE_OK") == 0);
    CHECK(strcmp(ple_status_name(PLE_E_TIMEOUT), "PLE_E_TIMEOUT") == 0);
    CHECK(strcmp(ple_status_name(12345), "unknown status") == 0);
    return check_done("test_version");
}
