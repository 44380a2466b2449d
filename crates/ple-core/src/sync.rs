//! Lock helpers: the one place a poisoned lock is recovered.
//!
//! A `Mutex` is poisoned when a thread panicked while holding it. Recovering the guard is sound
//! here because of an invariant every lock in this crate keeps: the value a lock guards is valid
//! at every point a panic can unwind from inside its critical section. The sections change it by
//! whole-value stores (a slot state, a failure record pushed, a join handle taken, a counter
//! added), so a panic leaves either the old value or the new one, both valid; the long work (a
//! step's reads, a consumer's dequant) runs outside the locks and under `catch_unwind`. The few
//! sections that make several dependent stores (the residency cap's chunk bookkeeping, a row
//! cache shard's insert or eviction) call nothing that can panic short of a bug in this crate.
//! Recovering keeps one panicking call from making the whole handle unusable (every later call
//! would panic in turn at the C boundary).

use std::sync::{Condvar, LockResult, Mutex, MutexGuard, TryLockError, WaitTimeoutResult};
use std::time::Duration;

/// Locks `m`, recovering the guard if the lock is poisoned (see the module doc for why that is
/// safe here).
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    recover(m.lock())
}

/// Locks `m` if no other thread holds it (`None` if one does), recovering the guard if the lock
/// is poisoned (see the module doc).
pub fn try_lock<T: ?Sized>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// The value a `Mutex` held, even if it is poisoned (see the module doc).
pub fn into_inner<T>(m: Mutex<T>) -> T {
    recover(m.into_inner())
}

/// A mutable borrow of what `m` holds, even if it is poisoned (see the module doc).
pub fn get_mut<T: ?Sized>(m: &mut Mutex<T>) -> &mut T {
    recover(m.get_mut())
}

/// Waits on `cv` with `guard` (see [`Condvar::wait`]), recovering a poisoned lock.
pub fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    recover(cv.wait(guard))
}

/// Waits on `cv` with `guard` for at most `timeout` (see [`Condvar::wait_timeout`]), recovering
/// a poisoned lock.
pub fn wait_timeout<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: Duration,
) -> (MutexGuard<'a, T>, WaitTimeoutResult) {
    recover(cv.wait_timeout(guard, timeout))
}

/// The value of a lock operation, poisoned or not.
fn recover<G>(r: LockResult<G>) -> G {
    r.unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A lock a thread panicked under is still usable, with the value it held.
    #[test]
    fn a_poisoned_lock_is_recovered_with_its_value() {
        let m = Arc::new(Mutex::new(7));
        let m2 = m.clone();
        let r = std::thread::spawn(move || {
            let mut g = m2.lock().unwrap();
            *g = 8;
            panic!("poison it");
        })
        .join();
        assert!(r.is_err());
        assert!(m.is_poisoned());
        assert_eq!(*lock(&m), 8);
        *try_lock(&m).expect("poisoned, not held") += 1;
        let held = lock(&m);
        assert!(try_lock(&m).is_none(), "held");
        drop(held);
        let cv = Condvar::new();
        let (g, to) = wait_timeout(&cv, lock(&m), Duration::from_millis(1));
        assert!(to.timed_out());
        assert_eq!(*g, 9);
        drop(g);
        let mut m = Arc::try_unwrap(m).unwrap();
        *get_mut(&mut m) += 1;
        assert_eq!(into_inner(m), 10);
    }
}
