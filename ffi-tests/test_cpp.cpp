// The C++ layer (ple-cpp.h): ple::check throws ple::error with the call's status and message,
// ple::open returns an owning ple_handle_ptr, and the deleter closes the handle when the owner
// goes away, on return and on a throw alike (a closed handle answers PLE_E_INVALID_ARGUMENT).
#include "check.h"
#include "ple-cpp.h"
#include "table_util.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

// Runs `f`; returns the status of the ple::error it throws (PLE_OK if it throws none), and copies
// the error's message into `message`.
template <class F>
static ple_status thrown_status(F f, std::string *message = nullptr) {
    try {
        f();
    } catch (const ple::error &e) {
        if (message) *message = e.message();
        std::string what = e.what();
        CHECK(what == std::string(e.name()) + ": " + e.message());
        CHECK(std::string(e.name()) == ple_status_name(e.status()));
        return e.status();
    }
    return PLE_OK;
}

// A handle is open while the library answers for it.
static bool is_open(const ple_handle *h) {
    ple_info info{};
    info.struct_size = sizeof info;
    return ple_table_info(h, &info) == PLE_OK;
}

int main() {
    // check: PLE_OK returns; any other status throws with the message of the failed call.
    CHECK(thrown_status([] { ple::check(PLE_OK); }) == PLE_OK);
    std::string msg;
    CHECK(thrown_status([] { ple::open("/nonexistent/ple-table"); }, &msg) == PLE_E_IO);
    CHECK(msg.find("/nonexistent/ple-table") != std::string::npos);
    CHECK(thrown_status([] { ple::check(ple_options_default(nullptr)); }) == PLE_E_INVALID_ARGUMENT);
    // the exception is a std::runtime_error for code that catches those
    bool caught = false;
    try {
        ple::check(PLE_E_TIMEOUT);
    } catch (const std::runtime_error &e) {
        caught = std::string(e.what()).rfind("PLE_E_TIMEOUT: ", 0) == 0;
    }
    CHECK(caught);

    char tmpl[] = "/tmp/ple-ffi-cpp-XXXXXX";
    char *dir = mkdtemp(tmpl);
    if (dir == NULL || make_table(dir, "--base 2000 --shards 8 --seed 11") != 0) {
        std::fprintf(stderr, "could not make a table\n");
        return 1;
    }

    ple_options opts = ple::default_options();
    CHECK(opts.struct_size == sizeof(ple_options));
    CHECK(ple::default_pack_options().struct_size == sizeof(ple_pack_options));
    opts.max_in_flight = 2;

    // Ownership: open, move, reset. The raw pointer outlives its owner only to be asked whether
    // the handle is still open (handle values are never reused, so the question is safe).
    ple_handle *raw = nullptr;
    {
        ple_handle_ptr h = ple::open(dir, &opts);
        CHECK(h != nullptr);
        raw = h.get();
        CHECK(is_open(raw));
        CHECK(ple::table_info(h.get()).row_bytes > 0);
        CHECK(ple::stats(h.get()).struct_size == sizeof(ple_counters));
        ple_handle_ptr moved = std::move(h);
        CHECK(h == nullptr && moved.get() == raw);
        CHECK(is_open(raw));  // a move closes nothing
    }
    CHECK(!is_open(raw));  // the scope's end closed it
    CHECK(thrown_status([raw] { ple::table_info(raw); }) == PLE_E_INVALID_ARGUMENT);

    // A throw between open and the end of the scope still closes the handle.
    raw = nullptr;
    ple_status st = thrown_status([&] {
        ple_handle_ptr h = ple::open(dir, &opts);
        raw = h.get();
        ple::check(ple_wait(h.get(), 7, 0));  // seq 7 was never submitted
    });
    CHECK(st == PLE_E_STATE);
    CHECK(raw != nullptr && !is_open(raw));

    // submit_ids: the ids of a batch give the batch's rows; a size that is no whole token throws.
    {
        ple_handle_ptr ih = ple::open(dir, &opts);
        int32_t toks[3] = {5, 77, 248044}, pos[3] = {4, 5, 6}, ctx[2] = {9, 10};
        uint64_t rid = 3;
        uint32_t qs[2] = {0, 3};
        ple_batch b = {toks, pos, 3, &rid, qs, 1, ctx};
        std::vector<int64_t> ids(3 * 16);
        ple::check(ple_ngram_ids(ih.get(), &b, ids.data()));
        ple::check(ple_submit(ih.get(), &b, 1));
        ple::submit_ids(ih.get(), ids, 2);
        const uint8_t *r1 = nullptr, *r2 = nullptr;
        uint32_t n1 = 0, n2 = 0;
        ple::check(ple_packed_rows(ih.get(), 1, &r1, &n1));
        ple::check(ple_packed_rows(ih.get(), 2, &r2, &n2));
        size_t bytes = 3 * 16 * (size_t)ple::table_info(ih.get()).row_bytes;
        CHECK(n1 == 3 && n2 == 3 && std::memcmp(r1, r2, bytes) == 0);
        std::vector<int64_t> short_ids(ids.begin(), ids.end() - 1);
        CHECK(thrown_status([&] { ple::submit_ids(ih.get(), short_ids, 3); }, &msg) == PLE_E_INVALID_ARGUMENT);
        CHECK(msg.find("whole number of tokens") != std::string::npos);
        ids[16 + 4] = -1;  // token 1, head 4
        CHECK(thrown_status([&] { ple::submit_ids(ih.get(), ids, 3); }, &msg) == PLE_E_INVALID_ARGUMENT);
        CHECK(msg.find("ids[1][4] = -1") != std::string::npos);
    }

    // reset() closes at once.
    ple_handle_ptr h = ple::open(dir, nullptr);
    raw = h.get();
    h.reset();
    CHECK(!is_open(raw));

    char cmd[4200];
    std::snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(std::system(cmd) == 0);
    return check_done("test_cpp");
}
