//! Whether this invocation works on the ledger itself or through `gpupin serve`, decided
//! once for every command that has both ways (exec, hold, release, evict, key): root
//! writes the ledger and reads the node's secret in process; anyone else asks the daemon,
//! which decides from SO_PEERCRED what they may do.

/// Which way a command goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Root: the ledger, in this process.
    Local,
    /// Anyone else: through `gpupin serve`'s socket.
    Daemon,
}

impl Route {
    /// This process's way, by its effective uid: only root may write the ledger.
    pub fn of_this_process() -> Route {
        match rustix::process::geteuid().is_root() {
            true => Route::Local,
            false => Route::Daemon,
        }
    }
}
