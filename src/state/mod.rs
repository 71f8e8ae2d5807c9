//! What is held and what happened: the ledger, the audit trail, the metrics.

pub mod audit;
pub mod ledger;
pub mod metrics;
