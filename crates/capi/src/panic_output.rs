//! Keeps panics caught at the C boundary off the host program's stderr.
//!
//! A Rust panic inside a `ca_*` call is caught and returned as `CA_STATUS_INTERNAL` with its
//! message (and where it happened) in `ca_last_error`; that is the whole report a C caller
//! needs. Rust's default panic hook would still print the panic, and with `RUST_BACKTRACE` set
//! a full backtrace, to the host's stderr. So the first call into the library installs a panic
//! hook that, for panics raised *while this thread is inside a `ca_*` call*, records the
//! location and prints nothing; every other panic (the host's own Rust code, other libraries)
//! goes to the hook that was installed before, unchanged.
//!
//! Printing is opt-in: `ca_set_panic_output(true)`, or the environment variable
//! `CA_PANIC_OUTPUT=1` when the program has not called `ca_set_panic_output`.
//!
//! Limits, documented in the header: a host that installs its own panic hook *after* its first
//! `ca_*` call replaces ours, so caught panics print again (they are still caught and reported).

use core::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Once, OnceLock};

/// `ca_set_panic_output` not called: the environment decides.
const UNSET: u8 = 0;
const QUIET: u8 = 1;
const PRINT: u8 = 2;

static CHOICE: AtomicU8 = AtomicU8::new(UNSET);
static INSTALL: Once = Once::new();

thread_local! {
    /// How many `ca_*` calls this thread is inside (nested only if a callback ever re-enters).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// Where this thread's last panic inside a `ca_*` call happened, for the error message.
    static LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Sets whether panics caught at the boundary are printed (through the previous hook).
pub(crate) fn set_print(print: bool) {
    CHOICE.store(if print { PRINT } else { QUIET }, Ordering::Relaxed);
}

fn print_wanted() -> bool {
    match CHOICE.load(Ordering::Relaxed) {
        UNSET => {
            static FROM_ENV: OnceLock<bool> = OnceLock::new();
            *FROM_ENV.get_or_init(|| std::env::var_os("CA_PANIC_OUTPUT").is_some_and(|v| v == "1"))
        }
        choice => choice == PRINT,
    }
}

fn inside() -> bool {
    DEPTH.try_with(|d| d.get() > 0).unwrap_or(false)
}

/// Installs the hook once per process.
fn install() {
    // `set_hook` panics on a panicking thread (a host destructor calling in during unwinding);
    // that panic would escape before `catch_unwind` is set up, so wait for a later call.
    if std::thread::panicking() {
        return;
    }
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if inside() {
                let location = info.location().map(|l| l.to_string());
                let _ = LOCATION.try_with(|slot| {
                    if let Ok(mut slot) = slot.try_borrow_mut() {
                        *slot = location;
                    }
                });
                if !print_wanted() {
                    return;
                }
            }
            previous(info);
        }));
    });
}

/// Marks this thread as inside a `ca_*` call while it lives.
pub(crate) struct Inside(());

impl Inside {
    /// Enters the boundary, installing the hook on first use. (`LOCATION` is not cleared here,
    /// to keep `ca_allocate`'s path short: the hook overwrites it on every panic inside, and a
    /// caught panic takes it right away, so it never names an older panic.)
    pub(crate) fn enter() -> Self {
        install();
        let _ = DEPTH.try_with(|d| d.set(d.get() + 1));
        Inside(())
    }

    /// Where the panic this call caught happened, if the hook saw it.
    pub(crate) fn panic_location(&self) -> Option<String> {
        LOCATION
            .try_with(|slot| slot.try_borrow_mut().ok()?.take())
            .ok()
            .flatten()
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let _ = DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
    }
}
