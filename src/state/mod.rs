//! What is held and what happened: the audit trail (below), the ledger (on it), the
//! metrics and usage (reading both). `open_ledger` puts them together for a configuration.

pub mod audit;
pub mod ledger;
pub mod metrics;
pub mod usage;

use crate::input::config::Config;
use ledger::{Ledger, LedgerError};

/// The ledger a configuration names (`Ledger::for_config`), with the metrics file it
/// names rewritten after every change.
pub fn open_ledger(config: &Config) -> Result<Ledger, LedgerError> {
    let ledger = Ledger::for_config(config)?;
    Ok(match &config.metrics_file {
        Some(file) => ledger.with_observer(Box::new(metrics::FileSink {
            file: file.clone(),
            config: config.clone(),
        })),
        None => ledger,
    })
}
