//! The one way into tract on a model's bytes: a panic inside it becomes an
//! [`OnnxError::Panicked`] naming what was being done, never a crashed trainer or a
//! dead env worker.
//!
//! A model is hostile input (often downloaded, and it travels to every node in
//! `welcome`), and tract 0.23 panics on some malformed models instead of returning an
//! error (a string initializer with raw data; a `ConstantOfShape` of 2^40 elements).
//! Every parse, analysis, typing, optimisation, plan and run therefore goes through
//! [`guarded`], which runs it under [`std::panic::catch_unwind`].
//!
//! **Quiet**: the process's panic hook would still print each caught panic to stderr
//! (the message is tract's, and may hold the model's strings). [`guarded`] installs,
//! once per process, a hook that stays silent for a panic on a thread that is inside
//! [`guarded`] (a thread-local flag, so other threads' panics print as before through
//! the hook that was installed first) and keeps that panic's location for the error;
//! the message travels in the error instead, bounded to [`MAX_PANIC_MESSAGE`] bytes and
//! escaped. A hook installed later by the embedding program replaces this one; then the
//! panic prints through it, and the error is the same.
//!
//! An allocation that fails aborts the process whatever catches it: the budgets checked
//! before tract sees the model ([`super::limits`]) are what keeps memory bounded.

use std::cell::{Cell, RefCell};
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

use super::OnnxError;
use crate::peer_text::bounded_to as bounded;

/// The most bytes of a panic's message an error keeps.
pub(super) const MAX_PANIC_MESSAGE: usize = 256;

thread_local! {
    /// Set while this thread is inside [`guarded`].
    static INSIDE: Cell<bool> = const { Cell::new(false) };
    /// Where the last panic caught on this thread happened.
    static LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

/// Installs the quiet hook once per process, in front of the hook in place.
fn install_hook() {
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if INSIDE.with(Cell::get) {
                let at = info.location().map(|l| format!("{}:{}", l.file(), l.line()));
                LOCATION.with(|l| *l.borrow_mut() = at);
            } else {
                previous(info);
            }
        }));
    });
}

/// Runs `f` (a call into tract on the model) and turns a panic in it into an
/// [`OnnxError::Panicked`] saying it happened while `doing` (e.g. "typing the model").
/// Nested calls are fine: the innermost one reports.
pub(super) fn guarded<T>(doing: &str, f: impl FnOnce() -> Result<T, OnnxError>) -> Result<T, OnnxError> {
    install_hook();
    let was_inside = INSIDE.with(|i| i.replace(true));
    // `AssertUnwindSafe`: whatever `f` touches is dropped or rebuilt by the caller on
    // an error (a runner forgets the plan that panicked).
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    INSIDE.with(|i| i.set(was_inside));
    match result {
        Ok(r) => r,
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_string());
            let at = LOCATION.with(|l| l.borrow_mut().take());
            Err(OnnxError::Panicked {
                doing: doing.to_string(),
                message: bounded(&message, MAX_PANIC_MESSAGE),
                at: at.map(|a| bounded(&a, MAX_PANIC_MESSAGE)).unwrap_or_default(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_naming_what_was_done_with_its_message_bounded() {
        let long = "x".repeat(10_000);
        let e = guarded::<()>("typing the model", || panic!("boom {long}")).unwrap_err();
        let OnnxError::Panicked { doing, message, at } = &e else {
            panic!("not a panic error: {e}");
        };
        assert_eq!(doing, "typing the model");
        assert!(message.starts_with("boom xxx"), "{message}");
        assert!(message.len() < MAX_PANIC_MESSAGE + 32, "{} bytes", message.len());
        assert!(message.ends_with("(10005 bytes)"), "{message}");
        assert!(at.contains("guard.rs"), "{at}");
        // The flag is cleared: the next call runs as usual.
        assert_eq!(guarded("again", || Ok(7)), Ok(7));
        assert!(!INSIDE.with(Cell::get));
    }

    #[test]
    fn errors_pass_through_and_nested_guards_restore_the_flag() {
        let e = guarded::<()>("outer", || {
            let inner = guarded::<()>("inner", || panic!("deep"));
            assert!(INSIDE.with(Cell::get), "still inside the outer guard");
            inner
        })
        .unwrap_err();
        assert!(
            matches!(&e, OnnxError::Panicked { doing, .. } if doing == "inner"),
            "{e}"
        );
        assert!(!INSIDE.with(Cell::get));
    }
}
