//! What is held and what happened: the audit trail (below), the ledger (on it), the
//! metrics and usage (reading both). `open_ledger` puts them together for a configuration.

pub(crate) mod audit;
pub(crate) mod ledger;
pub(crate) mod metrics;
pub(crate) mod node_access;
pub(crate) mod usage;

use crate::input::config::{Config, NodeAccess};
use ledger::{ChangeObserver, Ledger, LedgerError};

/// The ledger a configuration names (`Config::ledger_settings`), open for writing, with
/// what follows it after every change: the metrics file it names, and with
/// `node_access = "acl"` the GPU nodes' ACLs.
pub fn open_ledger(config: &Config) -> Result<Ledger, LedgerError> {
    let ledger = Ledger::open(&config.ledger_settings())?;
    let mut observers: Vec<Box<dyn ChangeObserver>> = Vec::new();
    if let Some(file) = &config.metrics_file {
        observers.push(Box::new(metrics::FileSink::new(file.clone(), config)));
    }
    if config.node_access == NodeAccess::Acl {
        observers.push(Box::new(node_access::AclSync::new(config)));
    }
    Ok(match observers.len() {
        0 => ledger,
        1 => ledger.with_observer(observers.remove(0)),
        _ => ledger.with_observer(Box::new(Observers(observers))),
    })
}

/// Several observers of one ledger, told in turn.
struct Observers(Vec<Box<dyn ChangeObserver>>);

impl ChangeObserver for Observers {
    fn changed(&self, ledger: &Ledger) {
        for observer in &self.0 {
            observer.changed(ledger);
        }
    }
}
