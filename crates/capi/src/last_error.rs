//! Where `ca_last_error` finds the reason of the last failure: per handle *and* per thread.
//!
//! A handle keeps one slot for each thread that has failed on it, so one thread's failure never
//! overwrites what another thread is about to read. Failures that have no handle to go to
//! (a NULL handle, `ca_create`, `ca_destroy`) go to a slot of the calling thread.
//!
//! The message pointer handed to C points into a `CString` held by the slot. Only the thread
//! that owns a slot replaces it, so the pointer stays valid on that thread until its next
//! failing call on the same handle (or the handle's destruction, or the thread's exit).

use core::cell::RefCell;
use core::ffi::{c_char, CStr};
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::CaStatus;

/// A failure's text: formatted, or (where no slot of our own can hold it) a constant.
enum Message {
    Owned(CString),
    Static(&'static CStr),
}

impl Message {
    fn as_ptr(&self) -> *const c_char {
        match self {
            Message::Owned(s) => s.as_ptr(),
            Message::Static(s) => s.as_ptr(),
        }
    }
}

/// One recorded failure.
struct Recorded {
    code: CaStatus,
    message: Message,
}

impl Recorded {
    fn new(code: CaStatus, message: String) -> Self {
        // The messages are built from our own format strings and `AllocError`'s `Display`,
        // neither of which writes a NUL; should one ever appear, the constant name stands in.
        let message = match CString::new(message) {
            Ok(s) => Message::Owned(s),
            Err(_) => Message::Static(code.name()),
        };
        Recorded { code, message }
    }
}

/// The key of a thread that has none: one in the middle of tearing down its thread-locals.
/// Such threads share one slot, so only constant messages (which never dangle) go there.
const NO_THREAD_KEY: u64 = 0;

static NEXT_THREAD_KEY: AtomicU64 = AtomicU64::new(NO_THREAD_KEY + 1);

thread_local! {
    /// This thread's key in the handles' slot lists; never reused by another thread.
    static THREAD_KEY: u64 = NEXT_THREAD_KEY.fetch_add(1, Ordering::Relaxed);
    /// The last failure of this thread that had no handle to go to.
    static WITHOUT_HANDLE: RefCell<Option<Recorded>> = const { RefCell::new(None) };
}

fn thread_key() -> u64 {
    THREAD_KEY.try_with(|k| *k).unwrap_or(NO_THREAD_KEY)
}

/// The last failure on one handle, for each thread that failed on it.
#[derive(Default)]
pub(crate) struct PerThread {
    slots: Mutex<Vec<(u64, Recorded)>>,
}

impl PerThread {
    /// Records a failure of the calling thread. Never panics.
    pub(crate) fn set(&self, code: CaStatus, message: String) {
        let key = thread_key();
        let recorded = if key == NO_THREAD_KEY {
            Recorded {
                code,
                message: Message::Static(code.name()),
            }
        } else {
            Recorded::new(code, message)
        };
        // A panic while the lock was held cannot leave the list half-written (every update is
        // one assignment or one push), so a poisoned lock is taken as it is.
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        match slots.iter_mut().find(|(k, _)| *k == key) {
            Some((_, slot)) => *slot = recorded,
            None => slots.push((key, recorded)),
        }
    }

    /// The calling thread's last failure on this handle: `CA_STATUS_OK` if it had none.
    pub(crate) fn get(&self) -> (CaStatus, *const c_char) {
        let key = thread_key();
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        match slots.iter().find(|(k, _)| *k == key) {
            Some((_, r)) => (r.code, r.message.as_ptr()),
            None => (CaStatus::Ok, CaStatus::Ok.name().as_ptr()),
        }
    }
}

/// Records a failure of the calling thread that has no handle to go to. Never panics; from a
/// thread tearing down its thread-locals the failure is not recorded (its status code still
/// tells the caller what happened).
pub(crate) fn set_without_handle(code: CaStatus, message: String) {
    let _ = WITHOUT_HANDLE.try_with(|slot| {
        if let Ok(mut slot) = slot.try_borrow_mut() {
            *slot = Some(Recorded::new(code, message));
        }
    });
}

/// The calling thread's last failure that had no handle: `CA_STATUS_OK` if it had none.
pub(crate) fn get_without_handle() -> (CaStatus, *const c_char) {
    WITHOUT_HANDLE
        .try_with(|slot| {
            let slot = slot.try_borrow().ok()?;
            slot.as_ref().map(|r| (r.code, r.message.as_ptr()))
        })
        .ok()
        .flatten()
        .unwrap_or((CaStatus::Ok, CaStatus::Ok.name().as_ptr()))
}
