//! Where `ca_last_error` finds the reason of the last failure: per handle *and* per thread.
//!
//! A handle keeps one slot for each thread that has failed on it, so one thread's failure never
//! overwrites what another thread is about to read. Failures that have no handle to go to
//! (a NULL handle, `ca_create`, `ca_destroy`) go to a slot of the calling thread.
//!
//! The message pointer handed to C points into a `CString` held by the slot. Only the thread
//! that owns a slot replaces or removes it, so the pointer stays valid on that thread until its
//! next failing call on the same handle (or the handle's destruction, or the thread's exit).
//!
//! A thread's slots go when the thread exits (`ThisThread`'s destructor), so a handle used by
//! many short-lived threads keeps only the slots of the threads still running. All of this is
//! on the failure path: a successful call never touches it.

use core::cell::RefCell;
use core::ffi::{c_char, CStr};
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

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
/// Such threads share one slot, so only constant messages (which never dangle) go there, and
/// since it is one slot per handle, it never grows with the number of threads.
const NO_THREAD_KEY: u64 = 0;

static NEXT_THREAD_KEY: AtomicU64 = AtomicU64::new(NO_THREAD_KEY + 1);

/// One handle's slots: for each thread that failed on the handle, its key and last failure.
/// Owned by the handle (`Arc`); each thread that recorded into it holds a `Weak` to it, so it
/// can take its slot out when it exits, even racing `ca_destroy`.
type Slots = Mutex<Vec<(u64, Recorded)>>;

/// The calling thread's side of the slots: its key, and the handles it recorded into.
///
/// Its destructor (run when the thread exits) removes the thread's slot from every handle that
/// is still alive, so a handle's list holds at most one slot per *live* thread (plus the shared
/// `NO_THREAD_KEY` slot): thread churn leaves nothing behind.
struct ThisThread {
    /// Never reused by another thread.
    key: u64,
    /// The handles this thread has a slot in (some may have been destroyed since: `Weak`).
    handles: RefCell<Vec<Weak<Slots>>>,
}

impl ThisThread {
    /// Notes that this thread is about to record into `slots`; false if it cannot (then the
    /// failure must go to the shared slot, or it would never be taken out).
    fn note(&self, slots: &Arc<Slots>) -> bool {
        let Ok(mut handles) = self.handles.try_borrow_mut() else {
            return false;
        };
        if !handles
            .iter()
            .any(|h| core::ptr::eq(h.as_ptr(), Arc::as_ptr(slots)))
        {
            // Forget the handles destroyed since, so a thread that fails on many short-lived
            // handles keeps a list as long as the live ones. A `Weak` keeps its allocation, so
            // the address compared above is never that of another, newer handle.
            handles.retain(|h| h.strong_count() > 0);
            handles.push(Arc::downgrade(slots));
        }
        true
    }
}

impl Drop for ThisThread {
    fn drop(&mut self) {
        for handle in self.handles.get_mut().drain(..) {
            // A handle destroyed before this thread exits took its slots with it; one being
            // destroyed right now stays allocated while `upgrade`'s `Arc` is held.
            if let Some(slots) = handle.upgrade() {
                let mut slots = slots.lock().unwrap_or_else(|e| e.into_inner());
                slots.retain(|(k, _)| *k != self.key);
            }
        }
    }
}

thread_local! {
    /// This thread's key and the handles it has a slot in.
    static THIS_THREAD: ThisThread = ThisThread {
        key: NEXT_THREAD_KEY.fetch_add(1, Ordering::Relaxed),
        handles: const { RefCell::new(Vec::new()) },
    };
    /// The last failure of this thread that had no handle to go to.
    static WITHOUT_HANDLE: RefCell<Option<Recorded>> = const { RefCell::new(None) };
}

/// The calling thread's key (`NO_THREAD_KEY` once its thread-locals are being torn down).
fn thread_key() -> u64 {
    THIS_THREAD.try_with(|t| t.key).unwrap_or(NO_THREAD_KEY)
}

/// The last failure on one handle, for each thread that failed on it and is still running.
#[derive(Default)]
pub(crate) struct PerThread {
    slots: Arc<Slots>,
}

impl PerThread {
    /// Records a failure of the calling thread. Never panics. Only failures come here: a
    /// successful call never touches the slots.
    pub(crate) fn set(&self, code: CaStatus, message: String) {
        let key = THIS_THREAD
            .try_with(|t| {
                if t.note(&self.slots) {
                    t.key
                } else {
                    NO_THREAD_KEY
                }
            })
            .unwrap_or(NO_THREAD_KEY);
        let recorded = if key == NO_THREAD_KEY {
            Recorded {
                code,
                message: Message::Static(code.name()),
            }
        } else {
            Recorded::new(code, message)
        };
        // A panic while the lock was held cannot leave the list half-written (every update is
        // one assignment, one push or one `retain` of plain values), so a poisoned lock is
        // taken as it is.
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

    /// How many slots the handle holds (tests: at most one per live thread that failed on it).
    #[cfg(test)]
    pub(crate) fn slot_count(&self) -> usize {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// How many handles the calling thread remembers having a slot in (tests).
#[cfg(test)]
pub(crate) fn handles_noted_by_this_thread() -> usize {
    THIS_THREAD.with(|t| t.handles.borrow().len())
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
