// libple's C++ layer: an owning pointer for the handle the C API creates, and a check that turns
// a failed status into an exception. Header-only C++17 over ple.h: every function here is inline
// and calls only the C API, so it adds no symbol to libple and no ABI. Include it instead of
// ple.h in C++.
//
//   ple_handle_ptr h = ple::open(table_dir, &opts);   // ple_close runs when `h` goes away
//   ple::check(ple_submit(h.get(), &batch, seq));     // throws ple::error unless PLE_OK
//
// (ple_pack creates no handle; steps are not owned objects: a step is consumed by
// ple_dequant_* or released with ple_release_step, and ple_close frees what is left.)
#ifndef PLE_CPP_H
#define PLE_CPP_H

#ifndef __cplusplus
#error "ple-cpp.h is C++; C code includes ple.h"
#endif

#include "ple.h"

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

// Closes a handle (ple_close) when its owner lets go of it.
struct ple_handle_deleter {
    void operator()(ple_handle *handle) const noexcept { ple_close(handle); }
};

// An owned handle: `ple_handle_ptr h(raw)` takes ownership of what ple_open returned.
typedef std::unique_ptr<ple_handle, ple_handle_deleter> ple_handle_ptr;

namespace ple {

// A failed libple call: its status, and the cause in words (ple_last_error_message() on the
// thread that failed, read when the exception was made). what() is "NAME: message".
class error : public std::runtime_error {
public:
    error(ple_status status, const char *message)
        : std::runtime_error(std::string(ple_status_name(status)) + ": " + (message ? message : "")),
          status_(status) {}

    // The status the call returned (a PLE_E_* value).
    ple_status status() const noexcept { return status_; }
    // Its static name ("PLE_E_IO", ...).
    const char *name() const noexcept { return ple_status_name(status_); }
    // The cause in words, without the name.
    const char *message() const noexcept { return what() + std::strlen(name()) + 2; }

private:
    ple_status status_;
};

// Returns if `status` is PLE_OK; otherwise throws ple::error with it and this thread's
// ple_last_error_message(). Call it on a status straight from the call that returned it, before
// another libple call on the thread replaces the message.
inline void check(ple_status status) {
    if (status != PLE_OK) throw error(status, ple_last_error_message());
}

// ple_options_default: the defaults, with struct_size set.
inline ple_options default_options() {
    ple_options o;
    check(ple_options_default(&o));
    return o;
}

// ple_pack_options_default: the defaults, with struct_size set.
inline ple_pack_options default_pack_options() {
    ple_pack_options o;
    check(ple_pack_options_default(&o));
    return o;
}

// ple_open, owning: `options` NULL for the defaults. Throws ple::error where ple_open fails.
inline ple_handle_ptr open(const char *table_dir, const ple_options *options = nullptr) {
    ple_handle *h = nullptr;
    check(ple_open(table_dir, options, &h));
    return ple_handle_ptr(h);
}

// ple_table_info: the table's facts, struct_size set by this function.
inline ple_info table_info(const ple_handle *handle) {
    ple_info info{};
    info.struct_size = sizeof info;
    check(ple_table_info(handle, &info));
    return info;
}

// ple_stats: the handle's counters now, struct_size set by this function.
inline ple_counters stats(const ple_handle *handle) {
    ple_counters counters{};
    counters.struct_size = sizeof counters;
    check(ple_stats(handle, &counters));
    return counters;
}

// ple_submit_ids of a container of int64_t row ids (`[tokens][num_heads]`, e.g. a
// std::vector<int64_t>): the token count from its size; throws on a size that is not a whole
// number of tokens, and as ple_submit_ids refuses.
template <class Ids>
inline void submit_ids(ple_handle *handle, const Ids &ids, uint64_t seq, ple_ids_flags flags = 0) {
    uint32_t heads = table_info(handle).num_heads;
    if (heads == 0 || ids.size() % heads != 0 || ids.size() / heads > UINT32_MAX) {
        std::string m = "ple::submit_ids: ids.size() " + std::to_string(ids.size()) +
                        " is not a whole number of tokens of " + std::to_string(heads) + " heads";
        throw error(PLE_E_INVALID_ARGUMENT, m.c_str());
    }
    check(ple_submit_ids(handle, ids.data(), (uint32_t)(ids.size() / heads), flags, seq));
}

}  // namespace ple

#endif  // PLE_CPP_H
