"""pytest of what the bindings accept as input, and of steps nobody holds any more.

Inputs: token, position, request-id, offset and context arrays reach libple with exactly the
caller's values or not at all: a float, a bool, a value the C type cannot hold, a wrong rank raise
`PleInvalidArgumentError` naming the argument, the index and the value (expected messages written
out by hand below), and nothing is submitted (checked by the seq the next submit gets and by the
ring's free slots). Values that fit are read as they are (compared with the ids of the same batch
given as int32).

Dropped steps: a `Step` garbage-collected unconsumed gives its ring slot back before the next
submit (timed against a `wait_timeout_us` of 60 s that a blocked submit would sit out), a
`packed_rows` view keeps its step, and a closed table releases everything."""

from __future__ import annotations

import gc
import subprocess
import time
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import pytest

import ple
from ple import _arrays
from test_ple import BASE, SEED, SHARDS, TWO, _ple_bin, file_rows





@pytest.fixture()
def t(table_dir):
    with ple.Table(table_dir, max_tokens_per_step=64, num_threads=1) as table:
        yield table


@contextmanager
def refused(message: str) -> Iterator[None]:
    """Expects `PleInvalidArgumentError` with exactly `message` (its text after the status name)."""
    with pytest.raises(ple.PleInvalidArgumentError) as e:
        yield
    assert e.value.message == message
    assert str(e.value) == f"PLE_E_INVALID_ARGUMENT: {message}"


# each bad input, and the message it must raise (argument, index, value)
BAD = [
    # floats: refused even when whole; the index points at the first fractional value
    (dict(tokens=[1.0, 2.5], positions=[0, 1]),
     "tokens must be integers (int32_t), got a float64 array: tokens[1] = 2.5"),
    (dict(tokens=np.array([3.0, 4.0]), positions=[0, 1]),
     "tokens must be integers (int32_t), got a float64 array: tokens[0] = 3.0"),
    (dict(tokens=[1, 2], positions=np.array([0.0, 0.5], np.float32)),
     "positions must be integers (int32_t), got a float32 array: positions[1] = 0.5"),
    (dict(tokens=np.array([True, False]), positions=[0, 1]),
     "tokens must be integers (int32_t), got a bool array: tokens[0] = True"),
    # out of the C type's range: int64 tokens past int32 (2**40 would read as 0, 2**32 + 5 as 5)
    (dict(tokens=np.array([1, 2**40], np.int64), positions=[0, 1]),
     "tokens[1] = 1099511627776 does not fit int32_t [-2147483648, 2147483647]"),
    (dict(tokens=[2**32 + 5], positions=[0]),
     "tokens[0] = 4294967301 does not fit int32_t [-2147483648, 2147483647]"),
    (dict(tokens=[1, 2], positions=np.array([0, 2**31], np.uint64)),
     "positions[1] = 2147483648 does not fit int32_t [-2147483648, 2147483647]"),
    # negative request ids (-1 would read as 2**64 - 1), ids past uint64, offsets past uint32
    (dict(tokens=[1], positions=[0], request_ids=[-1], query_start=[0, 1]),
     "request_ids[0] = -1 does not fit uint64_t [0, 18446744073709551615]"),
    (dict(tokens=[1, 2], positions=[0, 0], token_request_ids=[4, -7]),
     "token_request_ids[1] = -7 does not fit uint64_t [0, 18446744073709551615]"),
    (dict(tokens=[1], positions=[0], request_ids=[2**64], query_start=[0, 1]),
     "request_ids[0] = 18446744073709551616 does not fit uint64_t [0, 18446744073709551615]"),
    (dict(tokens=[1], positions=[0], request_ids=[3], query_start=np.array([-1, 1])),
     "query_start[0] = -1 does not fit uint32_t [0, 4294967295]"),
    (dict(tokens=[1], positions=[0], request_ids=[3.0], query_start=[0, 1]),
     "request_ids must be integers (uint64_t), got a float64 array: request_ids[0] = 3.0"),
    # wrong ranks: a 2-D token array is not flattened, a scalar is not a 1-element array
    (dict(tokens=[[1, 2], [3, 4]], positions=[0, 1, 2, 3]),
     "tokens must be a 1-D array, got shape (2, 2)"),
    (dict(tokens=5, positions=[0]), "tokens must be a 1-D array, got shape ()"),
    (dict(tokens=[1, 2], positions=[0, 1], request_ids=[[7]], query_start=[0, 2]),
     "request_ids must be a 1-D array, got shape (1, 1)"),
    # context: int32 values, 1-D or [requests][ngram_size - 1], exactly that many tokens
    (dict(tokens=[1], positions=[5], context=[[248044, 2**31]]),
     "context[0, 1] = 2147483648 does not fit int32_t [-2147483648, 2147483647]"),
    (dict(tokens=[1], positions=[5], context=[248044]),
     "context holds 1 tokens; 1 requests need 2 (2 each)"),
    (dict(tokens=[1], positions=[5], context=np.zeros((1, 1, 2), np.int32)),
     "context must be a 1-D to 2-D array, got shape (1, 1, 2)"),
    # mixed Python objects
    (dict(tokens=[1, "2"], positions=[0, 1]),
     "tokens must be integers (int32_t), got a <U21 array: tokens[0] = '1'"),
]  # fmt: skip


@pytest.mark.parametrize("kwargs,message", BAD, ids=[m.split(" ")[0] + str(i) for i, (_, m) in enumerate(BAD)])
def test_a_bad_input_is_refused_by_name_index_and_value(t, kwargs, message):
    with refused(message):
        t.submit(**kwargs)
    with refused(message):  # the same checks for every call that takes a batch
        t.ngram_ids(**kwargs)
    with refused(message):
        t.prefetch_ahead(**kwargs)
    # nothing was submitted: the next step gets seq 1, and both ring slots are free
    steps = [t.submit(**TWO), t.submit(**TWO)]
    assert [s.seq for s in steps] == [1, 2]
    for s in steps:
        s.release()


def test_the_refusals_are_value_errors_of_status_invalid_argument(t):
    with pytest.raises(ValueError) as e:
        t.submit([0.5], [0])
    assert isinstance(e.value, ple.PleError) and e.value.name == "PLE_E_INVALID_ARGUMENT"
    assert e.value.status == ple.Status.INVALID_ARGUMENT


def test_values_that_fit_are_read_as_they_are(t):
    toks, pos = [11, 12, 13, 14, 15], [0, 1, 2, 3, 4]
    want = t.ngram_ids(np.array(toks, np.int32), np.array(pos, np.int32), request_ids=np.array([7], np.uint64),
                       query_start=np.array([0, 5], np.uint32))  # fmt: skip
    # wider and narrower integer dtypes, unsigned, Python ints, non-contiguous views: the same ids
    for conv in (lambda a: np.array(a, np.int64), lambda a: np.array(a, np.uint16), list, tuple,
                 lambda a: np.repeat(np.array(a, np.int64), 2)[::2]):  # fmt: skip
        got = t.ngram_ids(conv(toks), conv(pos), request_ids=conv([7]), query_start=conv([0, 5]))
        np.testing.assert_array_equal(got, want)
    # the extremes of each C type pass the bindings (libple then judges them)
    big = _arrays.host_input([2**64 - 1, 0], np.uint64, "request_ids")
    assert big.dtype == np.uint64 and big.tolist() == [2**64 - 1, 0]
    low = _arrays.host_input(np.array([-(2**31), 2**31 - 1], np.int64), np.int32, "tokens")
    assert low.dtype == np.int32 and low.tolist() == [-(2**31), 2**31 - 1]
    # an empty list is an empty array of the type (libple refuses a step of 0 tokens itself)
    assert _arrays.host_input([], np.int32, "tokens").dtype == np.int32
    with pytest.raises(ple.PleInvalidArgumentError):
        t.submit([], [])


def test_a_token_past_the_vocabulary_is_libples_refusal(t):
    with pytest.raises(ple.PleInvalidArgumentError) as e:
        t.submit([248320], [0])
    assert "248320" in e.value.message


def test_scalar_arguments_are_checked_too(t):
    with refused("seq must be an integer, got 2.5"):
        t.submit(**TWO, seq=2.5)
    with refused("seq = -1 is outside [0, 18446744073709551615]"):
        t.submit(**TWO, seq=-1)
    with refused("request_id = -1 is outside [0, 18446744073709551615]"):
        t.release_request(-1)
    with refused("timeout_us must be an integer, got 1.5"):
        t.wait(1, 1.5)
    with refused("seq must be an integer, got 1.0"):
        t.wait(1.0)
    with refused("max_in_flight = -1 is outside [0, 4294967295]"):
        ple.Table(t.path, max_in_flight=-1)
    with refused("wait_timeout_us must be an integer, got 0.5"):
        ple.Table(t.path, wait_timeout_us=0.5)


def test_a_zero_row_output_is_refused_for_its_rows(t):
    for out in (np.zeros((0, 2560), np.float32), np.zeros((0, 2560), np.float32, order="F"),
                np.zeros(0, np.float32)):  # fmt: skip
        s = t.submit(**TWO)
        with pytest.raises(ValueError, match=r"^out holds 0 rows, the step has 8 tokens$"):
            s.dequant_cpu(out)
        with pytest.raises(ValueError, match=r"^out holds 0 rows, the step has 8 tokens$"):
            t.dequant_cpu(s.seq, out)  # by seq: the table knows the step's tokens
        s.release()


def test_a_step_given_by_seq_is_checked_against_its_tokens(t):
    s = t.submit(**TWO)
    with pytest.raises(ValueError, match="out holds 4 rows, the step has 8 tokens"):
        t.dequant_cpu(s.seq, np.zeros((4, 2560), np.float32))
    got = t.dequant_cpu(s.seq)  # a new array of the step's 8 rows
    assert got.shape == (8, 2560)


# -- steps nobody holds ------------------------------------------------------------------------


def test_dropped_steps_do_not_hold_ring_slots(table_dir):
    # 2 slots and a 60 s wait for a free one: a third submit behind two unreachable steps would
    # block for 60 s (and then time out) if their slots were not given back
    with ple.Table(table_dir, max_in_flight=2, wait_timeout_us=60_000_000) as t:
        want = t.submit(**TWO).dequant_cpu()
        t.submit(**TWO)  # dropped at once: nothing holds the Step
        s = t.submit(**TWO)
        del s
        gc.collect()
        t0 = time.monotonic()
        third = t.submit(**TWO)
        assert time.monotonic() - t0 < 10
        np.testing.assert_array_equal(third.dequant_cpu(), want)
        for _ in range(5):  # a loop that never consumes: each submit finds a slot
            t.submit(**TWO)
        assert time.monotonic() - t0 < 20
    # the same under ring_full_policy "error": no PLE_E_STATE for a full ring
    with ple.Table(table_dir, max_in_flight=1, ring_full_policy="error") as t:
        for _ in range(4):
            t.submit(**TWO)


def test_a_step_held_or_viewed_keeps_its_slot(table_dir):
    with ple.Table(table_dir, max_in_flight=2, ring_full_policy="error") as t:
        kept = t.submit(**TWO)
        ids = t.ngram_ids(**TWO)
        rows = t.submit(**TWO).packed_rows()  # the view holds its step
        gc.collect()
        with pytest.raises(ple.PleStateError):
            t.submit(**TWO)  # both slots are held: nothing was released
        np.testing.assert_array_equal(rows, file_rows(table_dir, ids))
        del rows
        gc.collect()
        t.submit(**TWO).release()  # the view's step went with the view
        assert not kept.consumed
        kept.release()


def test_a_step_consumed_by_seq_is_not_released_again(table_dir):
    with ple.Table(table_dir, max_in_flight=1, ring_full_policy="error") as t:
        seq = t.submit(**TWO).seq  # the Step is dropped here: released before the next submit
        got = t.submit(**TWO, seq=seq + 1)
        with pytest.raises(ple.PleStateError):
            t.release_step(seq)  # it was released
        t.dequant_cpu(got.seq, np.zeros((8, 2560), np.float32))
        del got  # consumed by seq: its Step has nothing left to release
        gc.collect()
        t.submit(**TWO).release()


def test_closing_releases_every_step(table_dir):
    t = ple.Table(table_dir, max_in_flight=2)
    steps = [t.submit(**TWO), t.submit(**TWO)]
    t.close()
    del steps  # their table is closed: dropping them releases nothing and raises nothing
    gc.collect()
    with ple.Table(table_dir, max_in_flight=2, ring_full_policy="error") as t2:  # a fresh handle
        t2.submit(**TWO), t2.submit(**TWO)


def test_cpu_tensors_are_checked_like_arrays(t):
    torch = pytest.importorskip("torch")
    with refused("tokens must be integers (int32_t), got a float32 array: tokens[0] = 1.0"):
        t.submit(torch.tensor([1.0, 2.0]), torch.tensor([0, 1]))
    with refused("tokens[1] = 4294967301 does not fit int32_t [-2147483648, 2147483647]"):
        t.submit(torch.tensor([1, 2**32 + 5]), torch.tensor([0, 1]))
    with refused("tokens must be a 1-D array, got shape (2, 4)"):
        t.submit(torch.tensor(TWO["tokens"]).reshape(2, 4), torch.tensor(TWO["positions"]))
    want = t.ngram_ids(**TWO)
    got = t.ngram_ids(torch.tensor(TWO["tokens"]).long(), torch.tensor(TWO["positions"]).long(),
                      request_ids=torch.tensor([7, 9]), query_start=torch.tensor([0, 5, 8]))  # fmt: skip
    np.testing.assert_array_equal(got, want)
