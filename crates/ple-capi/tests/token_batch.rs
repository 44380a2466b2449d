//! `ple_submit_tokens` / `ple_ngram_ids_tokens` through the C API against the offsets form
//! (`ple_submit` / `ple_ngram_ids`) on two handles fed the same steps: ids, packed rows and
//! dequantised rows come in the caller's token order; bad per-token batches are refused.

use ple::*;
use std::ffi::{CStr, CString};

const H: usize = 16;

mod common;

/// The generated table of `common::table` and its path.
struct Table {
    _dir: tempfile::TempDir,
    path: CString,
}

fn table() -> Table {
    let (d, path) = common::table();
    Table { _dir: d, path }
}

fn open(t: &Table) -> *mut ple_handle {
    // SAFETY: ple_options is plain data filled by ple_options_default; the path and out pointer are valid for the call.
    unsafe {
        let mut o: ple_options = std::mem::zeroed();
        assert_eq!(ple_options_default(&mut o), PLE_OK);
        o.max_tokens_per_step = 64;
        o.num_threads = 1;
        let mut h = std::ptr::null_mut();
        assert_eq!(ple_open(t.path.as_ptr(), &o, &mut h), PLE_OK);
        h
    }
}

fn last_error() -> String {
    // SAFETY: ple_last_error_message returns a NUL-terminated string valid until the next libple call on this thread.
    unsafe { CStr::from_ptr(ple_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

/// One step in both forms: spans `(request id, first position, tokens)`, and the caller order
/// `perm` (caller token i = offsets token perm[i]).
struct Step {
    tokens: Vec<i32>,
    positions: Vec<i32>,
    ids: Vec<u64>,
    qs: Vec<u32>,
    tok: Vec<i32>,
    pos: Vec<i32>,
    tid: Vec<u64>,
    perm: Vec<usize>,
}

impl Step {
    fn new(spans: &[(u64, i32, &[i32])], perm: &[usize]) -> Step {
        let mut s = Step {
            tokens: vec![],
            positions: vec![],
            ids: vec![],
            qs: vec![0],
            tok: vec![],
            pos: vec![],
            tid: vec![],
            perm: perm.to_vec(),
        };
        let mut owner = vec![];
        for &(id, p, t) in spans {
            s.ids.push(id);
            s.tokens.extend_from_slice(t);
            s.positions.extend(p..p + t.len() as i32);
            owner.extend(std::iter::repeat_n(id, t.len()));
            s.qs.push(s.tokens.len() as u32);
        }
        for &j in perm {
            s.tok.push(s.tokens[j]);
            s.pos.push(s.positions[j]);
            s.tid.push(owner[j]);
        }
        s
    }

    fn offsets(&self) -> ple_batch {
        ple_batch {
            tokens: self.tokens.as_ptr(),
            positions: self.positions.as_ptr(),
            num_tokens: self.tokens.len() as u32,
            request_ids: self.ids.as_ptr(),
            query_start: self.qs.as_ptr(),
            num_requests: self.ids.len() as u32,
            context: std::ptr::null(),
        }
    }

    fn per_token(&self) -> ple_token_batch {
        ple_token_batch {
            struct_size: std::mem::size_of::<ple_token_batch>(),
            tokens: self.tok.as_ptr(),
            positions: self.pos.as_ptr(),
            token_request_ids: self.tid.as_ptr(),
            num_tokens: self.tok.len() as u32,
            context: std::ptr::null(),
        }
    }
}

#[test]
fn per_token_rows_and_ids_come_in_callers_order() {
    let t = table();
    let (ho, ht) = (open(&t), open(&t));
    let steps = [
        // prefill of two requests, interleaved
        Step::new(
            &[(7, 0, &[11, 12, 13, 14]), (9, 0, &[21, 22, 23])],
            &[4, 0, 5, 3, 1, 6, 2],
        ),
        // decode: request 9 first, then 7 (reverse of the offsets order), plus a new request 3
        Step::new(
            &[(7, 4, &[15]), (9, 3, &[24]), (3, 0, &[31, 32])],
            &[1, 3, 0, 2],
        ),
        // speculative: request 7 three tokens, positions reversed
        Step::new(&[(7, 5, &[16, 17, 18])], &[2, 1, 0]),
    ];
    for (i, s) in steps.iter().enumerate() {
        let seq = i as u64 + 1;
        let n = s.tokens.len();
        // SAFETY: the batches borrow `s`, which outlives the calls; the id and row buffers hold what each call writes.
        unsafe {
            let (bo, bt) = (s.offsets(), s.per_token());
            let mut ido = vec![0i64; n * H];
            let mut idt = vec![0i64; n * H];
            assert_eq!(ple_ngram_ids(ho, &bo, ido.as_mut_ptr()), PLE_OK);
            assert_eq!(ple_ngram_ids_tokens(ht, &bt, idt.as_mut_ptr()), PLE_OK);
            for (c, &j) in s.perm.iter().enumerate() {
                assert_eq!(
                    idt[c * H..(c + 1) * H],
                    ido[j * H..(j + 1) * H],
                    "ids step {seq}"
                );
            }
            assert_eq!(ple_submit(ho, &bo, seq), PLE_OK);
            assert_eq!(ple_submit_tokens(ht, &bt, seq), PLE_OK, "{}", last_error());
            let (mut ro, mut rt) = (std::ptr::null(), std::ptr::null());
            let (mut no, mut nt) = (0u32, 0u32);
            assert_eq!(ple_packed_rows(ho, seq, &mut ro, &mut no), PLE_OK);
            assert_eq!(ple_packed_rows(ht, seq, &mut rt, &mut nt), PLE_OK);
            assert_eq!((no, nt), (n as u32, n as u32));
            let tok_bytes = H * 90;
            let ro = std::slice::from_raw_parts(ro, n * tok_bytes);
            let rt = std::slice::from_raw_parts(rt, n * tok_bytes);
            for (c, &j) in s.perm.iter().enumerate() {
                assert_eq!(
                    rt[c * tok_bytes..(c + 1) * tok_bytes],
                    ro[j * tok_bytes..(j + 1) * tok_bytes],
                    "packed rows step {seq} token {c}"
                );
            }
            let d = 2560; // the test table: 16 heads of 160
            let mut outo = vec![0f32; n * d];
            let mut outt = vec![0f32; n * d];
            let cpu = |h, out: &mut Vec<f32>| {
                ple_dequant_cpu(h, seq, out.as_mut_ptr().cast(), PLE_DTYPE_F32, d, 0)
            };
            assert_eq!(cpu(ho, &mut outo), PLE_OK);
            assert_eq!(cpu(ht, &mut outt), PLE_OK);
            for (c, &j) in s.perm.iter().enumerate() {
                assert_eq!(outt[c * d..(c + 1) * d], outo[j * d..(j + 1) * d]);
            }
        }
    }
    // SAFETY: both handles came from ple_open and are closed once.
    unsafe {
        ple_close(ho);
        ple_close(ht);
    }
}

#[test]
fn bad_per_token_batches_are_refused() {
    let t = table();
    let h = open(&t);
    let s = Step::new(&[(7, 0, &[11, 12, 13])], &[0, 1, 2]);
    // SAFETY: the batch borrows `s`, alive across the calls; `h` is an open handle.
    unsafe {
        let mut b = s.per_token();
        b.struct_size = 8;
        assert_eq!(ple_submit_tokens(h, &b, 1), PLE_E_INVALID_ARGUMENT);
        assert!(
            last_error().contains("batch.struct_size is 8"),
            "{}",
            last_error()
        );
        let mut b = s.per_token();
        b.token_request_ids = std::ptr::null();
        assert_eq!(ple_submit_tokens(h, &b, 1), PLE_E_INVALID_ARGUMENT);
        assert!(
            last_error().contains("batch.token_request_ids"),
            "{}",
            last_error()
        );
        let gap = [0i32, 2, 3];
        let mut b = s.per_token();
        b.positions = gap.as_ptr();
        assert_eq!(ple_submit_tokens(h, &b, 1), PLE_E_INVALID_ARGUMENT);
        assert!(
            last_error().contains("token 2 at position 3 but its 3 tokens start at position 0"),
            "{}",
            last_error()
        );
        let mut b = s.per_token();
        b.num_tokens = 0;
        assert_eq!(ple_submit_tokens(h, &b, 1), PLE_E_INVALID_ARGUMENT);
        assert!(last_error().contains("no tokens"), "{}", last_error());
        // nothing was recorded by the refused steps: tracked position 3 is unknown
        let next = Step::new(&[(7, 3, &[14])], &[0]);
        assert_eq!(
            ple_submit_tokens(h, &next.per_token(), 1),
            PLE_E_INVALID_ARGUMENT
        );
        assert!(last_error().contains("missing context"), "{}", last_error());
        // stateless: context in order of first appearance
        let two = Step::new(&[(7, 3, &[14]), (8, 5, &[40])], &[1, 0]);
        let ctx = [5, 6, 12, 13]; // request 8's two tokens, then request 7's
        let mut b = two.per_token();
        b.context = ctx.as_ptr();
        let mut ids = vec![0i64; 2 * H];
        assert_eq!(ple_ngram_ids_tokens(h, &b, ids.as_mut_ptr()), PLE_OK);
        let offs = Step::new(&[(8, 5, &[40]), (7, 3, &[14])], &[0, 1]);
        let mut bo = offs.offsets();
        bo.context = ctx.as_ptr();
        let mut want = vec![0i64; 2 * H];
        assert_eq!(ple_ngram_ids(h, &bo, want.as_mut_ptr()), PLE_OK);
        assert_eq!(ids, want);
        ple_close(h);
    }
}
