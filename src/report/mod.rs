//! What people and scripts read, rendered to strings: `gpupin status` (from one look at
//! the machine, `status::Snapshot`, which `gpupin serve`'s `status` op returns too),
//! `gpupin queue`, `gpupin inventory`, `gpupin log` (`audit`), `gpupin usage` and `gpupin
//! pick --explain`; tables for people, JSON for scripts, colour for a terminal when the
//! binary asks. The binary prints them.

mod audit;
pub(crate) mod explain;
mod holder;
mod inventory;
mod leftovers;
mod live;
mod queue;
pub(crate) mod status;
mod table;
mod usage;

pub use audit::{log_row, log_table};
pub use inventory::{inventory_json, inventory_table};
pub(crate) use leftovers::Leftover;
pub(crate) use leftovers::leftovers;
pub use queue::{queue_json, queue_table};
pub use status::{Status, status_table};
use table::Style;
pub use usage::{usage_json, usage_table};

/// The widest a status line gets: a terminal's 80 columns.
pub(crate) const STATUS_WIDTH: usize = 80;

/// Bytes as the GiB figure nvidia-smi users expect.
fn gib(bytes: u64) -> String {
    format!("{:.0}GiB", bytes as f64 / (1u64 << 30) as f64)
}

fn paint_if(colour: bool, text: String, styles: &[Style]) -> String {
    match colour {
        true => table::paint(&text, styles),
        false => text,
    }
}
