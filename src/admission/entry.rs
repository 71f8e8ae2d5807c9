//! The error of the steps every entry point that gives a container GPUs takes (the OCI
//! hook, podman's precreate, the Docker shim): the config, the container id, the claim,
//! the request, the inventory, the ledger, the admission and its edits. Each entry
//! point's own error wraps it (`Entry`) beside its few variants of its own, so that a
//! step reads the same whichever entry point failed in it, and a step added here is
//! added to all of them at once.

use crate::admission::admit::AdmitError;
use crate::admission::edits::EditsError;
use crate::host::inventory::InventoryError;
use crate::input::config::ConfigError;
use crate::input::request::RequestError;
use crate::model::holder::BadHolderId;
use crate::state::ledger::{ClaimError, LedgerError};

/// A failed step that every entry point takes; each message is its source's own.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EntryError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    BadId(#[from] BadHolderId),
    #[error(transparent)]
    Claim(#[from] ClaimError),
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Admit(#[from] AdmitError),
    #[error(transparent)]
    Edits(#[from] EditsError),
}

/// `From` each of `EntryError`'s sources for an entry point's error that has an
/// `Entry(#[from] EntryError)` variant, so that `?` on a step's own error works there as
/// it does on `EntryError` (Rust's `?` converts once). The list is `EntryError`'s: a type
/// here that it lacks does not compile.
macro_rules! wrap_entry_errors {
    ($outer:ty) => {
        $crate::admission::entry::wrap_entry_errors!(@from $outer:
            $crate::input::config::ConfigError,
            $crate::model::holder::BadHolderId,
            $crate::state::ledger::ClaimError,
            $crate::input::request::RequestError,
            $crate::host::inventory::InventoryError,
            $crate::state::ledger::LedgerError,
            $crate::admission::admit::AdmitError,
            $crate::admission::edits::EditsError,
        );
    };
    (@from $outer:ty: $($source:ty),+ $(,)?) => {
        $(
            impl From<$source> for $outer {
                fn from(source: $source) -> Self {
                    Self::from($crate::admission::entry::EntryError::from(source))
                }
            }
        )+
    };
}
pub(crate) use wrap_entry_errors;

#[cfg(test)]
mod tests {
    use crate::engines::hook::HookError;
    use crate::engines::runtime::ShimError;
    use crate::input::request::{self, Origin};

    /// A step's error reads the same from the hook and from the shim, chain included.
    #[test]
    fn a_step_fails_alike_in_every_entry_point() {
        let bad = || request::from_pairs(&[("gpupin.count", "-1")], Origin::Annotations);
        let hook: HookError = bad().unwrap_err().into();
        let shim: ShimError = bad().unwrap_err().into();
        let line = crate::base::message::one_line(&hook);
        assert!(line.starts_with("invalid gpupin.count=\"-1\""), "{line}");
        assert_eq!(line, crate::base::message::one_line(&shim));
        assert_eq!(line, crate::base::message::one_line(&bad().unwrap_err()));
    }
}
