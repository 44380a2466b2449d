//! Host-side tests of the GPU mode's pipeline logic, runnable without a GPU: CUDA Graph reclaim
//! on re-prepare, a refused prepare changing nothing, the ring's lock not held while a failure is
//! published to the device, and `wait` on a step that has left the ring. (The ring's own reclaim
//! is tested in `ring/tests.rs`; the device side by `ffi-tests/gpu/device-check.sh`.)

use super::*;
use crate::dequant::cpu::OutArgs;
use crate::model::RowFormat;
use crate::step::options::RingFullPolicy;
use crate::step::ring::SlotState;
use crate::step::shared::FORCE_SLOT_BY_SEQ;
use crate::synth;

fn table() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    synth::write_table(d.path(), RowFormat::Fp8, &synth::small_config(2000, 4), 7).unwrap();
    d
}

/// A CPU handle with the GPU mode's `seq % slots` ring and `ring_full_policy = Error`.
fn open_seq_ring(dir: &Path, slots: u32) -> Pipeline {
    let o = OpenOptions {
        max_tokens_per_step: 64,
        num_threads: 1,
        max_in_flight: slots,
        ring_full_policy: RingFullPolicy::Error,
        wait_timeout_us: 20_000_000,
        ..OpenOptions::default()
    };
    FORCE_SLOT_BY_SEQ.with(|f| f.set(true));
    let p = Pipeline::open(dir, o);
    FORCE_SLOT_BY_SEQ.with(|f| f.set(false));
    p.unwrap()
}

/// One request of one token (a fresh request id each time: no tracked history needed).
fn submit(p: &Pipeline, seq: u64) -> Result<()> {
    let (tokens, positions, ids, qs) = ([EOS_TOKEN], [0i32], [seq], [0u32, 1]);
    p.submit(
        &Batch {
            tokens: &tokens,
            positions: &positions,
            request_ids: &ids,
            query_start: &qs,
            context: None,
        },
        seq,
    )
}
const EOS_TOKEN: i32 = crate::model::EOS_TOKEN_ID;

fn slot_states(p: &Pipeline) -> Vec<SlotState> {
    p.sh.completion.slot_states()
}

/// Re-calling `ple_graph_prepare` must not strand a Ready step a replay consumed (its slot would
/// never be freed: the new base no longer counts it, and the next submit into it would wait out
/// the timeout). With a stand-in `consumed` word the whole path runs on the CPU: prepare, steps
/// consumed by "replays", re-prepare, and the next steps must find their slots free
/// (ring_full_policy = Error refuses otherwise).
#[test]
fn re_prepare_frees_the_slots_of_steps_replays_consumed() {
    let d = table();
    let p = open_seq_ring(d.path(), 4);
    p.rebase_graph(1, || Ok(())).unwrap();
    for seq in 1..=4 {
        submit(&p, seq).unwrap();
    }
    p.wait(4, 0).unwrap();
    assert!(
        slot_states(&p)
            .iter()
            .all(|s| matches!(s, SlotState::Ready { .. }))
    );
    // replays consumed steps 1..=3 (the ring has not looked yet), then the engine re-prepares
    // at step 5 (e.g. to recover after a device error)
    p.hooks().graph_consumed.store(3, Ordering::SeqCst);
    p.rebase_graph(5, || Ok(())).unwrap();
    p.hooks().graph_consumed.store(4, Ordering::SeqCst); // what the new prepare enqueues
    // steps 5..=7 go to slots 1..=3, the slots of the consumed steps 1..=3
    for seq in 5..=7 {
        submit(&p, seq).unwrap_or_else(|e| panic!("step {seq}: {e}"));
    }
    // step 4 was not consumed by any replay: it keeps slot 0 until released
    let e = submit(&p, 8).unwrap_err();
    assert!(e.to_string().contains("ring full: slot 0"), "{e}");
    p.release_step(4).unwrap();
    submit(&p, 8).unwrap();
    // consumed steps have left the ring; waiting for them is not an error
    p.wait(2, 0).unwrap();
}

#[test]
fn a_refused_prepare_changes_nothing() {
    let d = table();
    let p = open_seq_ring(d.path(), 2);
    p.rebase_graph(3, || Ok(())).unwrap();
    let e = p
        .rebase_graph(9, || {
            crate::dequant::gpu::capture_allowed(
                crate::dequant::gpu::StreamCall::GraphPrepare,
                true,
            )
        })
        .unwrap_err();
    assert!(e.to_string().contains("cannot be captured"), "{e}");
    assert_eq!(p.sh.completion.graph_base(), 3, "base kept");
}

/// A failed step is published to the device without the ring's lock: whatever that publish
/// does, no API call may wait behind it.
#[test]
fn a_failed_step_is_published_to_the_device_without_the_ring_lock() {
    let d = table();
    let p = open_seq_ring(d.path(), 2);
    p.hooks().fail_seq.store(2, Ordering::SeqCst);
    submit(&p, 1).unwrap();
    submit(&p, 2).unwrap();
    let t0 = Instant::now();
    while p.hooks().device_failures.load(Ordering::SeqCst) == 0 || p.done() < 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "step 2 never finished"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(p.hooks().device_failures.load(Ordering::SeqCst), 1);
    assert!(
        p.hooks().ring_free_at_device_publish.load(Ordering::SeqCst),
        "the ring's lock was held while the failure was published to the device"
    );
    assert!(p.wait(2, 0).unwrap_err().to_string().contains("injected"));
}

/// `ple_wait` agrees with `ple.h`: a step that was consumed or released returns OK once complete
/// (its failure while the failure is still recorded); only a seq never submitted is STATE.
#[test]
fn wait_on_a_consumed_step_is_ok_and_on_an_unsubmitted_one_state() {
    let d = table();
    let p = open_seq_ring(d.path(), 2);
    submit(&p, 1).unwrap();
    let mut out = vec![0f32; 2560];
    let args = OutArgs {
        dtype: crate::dequant::cpu::Dtype::F32,
        stride: 2560,
        accumulate: false,
    };
    // SAFETY: `out` holds one token of 2560 f32 and is not used elsewhere during the call.
    unsafe { p.dequant_cpu(1, out.as_mut_ptr() as *mut u8, args) }.unwrap();
    p.wait(1, 0).unwrap();
    p.wait(1, 1).unwrap();
    submit(&p, 2).unwrap();
    p.release_step(2).unwrap();
    p.wait(2, 0).unwrap();
    let e = p.wait(3, 0).unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::State);
    assert!(e.to_string().contains("never submitted"), "{e}");
    assert_eq!(p.wait(0, 0).unwrap_err().kind(), crate::ErrorKind::State);
}
