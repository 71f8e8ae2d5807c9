//! The machine an allocation is decided against, besides the ledger itself: what the
//! allocation (`allocate`) and what narrows it (`scope`) both read.

use crate::host::whose::Seen;
use crate::input::config::PolicyName;
use crate::model::gpu::Inventory;
use crate::model::live::Live;

/// The machine an allocation is decided against, besides the ledger itself.
#[derive(Clone, Copy)]
pub struct Machine<'a> {
    pub inventory: &'a Inventory,
    /// Live figures per position, when read (policies and filters that need them).
    pub live: Option<&'a [Live]>,
    pub default_policy: PolicyName,
    /// Shared holders one GPU takes at most.
    pub max_shared: u32,
    /// How many GPUs people may hold, and which; `None`: no limits.
    pub limits: Option<&'a crate::model::limits::Limits>,
    /// The processes on each GPU, by position, where they are to be avoided (`foreign =
    /// "avoid"`, and a source that lists them); `None`: processes are not looked at.
    pub processes: Option<&'a [Vec<Seen>]>,
    /// Whether a plain count may take MIG instances (the `mig` key).
    pub mig_units: crate::input::config::MigUnits,
    /// A preview that gives nothing (`gpupin pick`): a MIG instance whose nodes gpupin
    /// does not know (an import of `nvidia-smi -L`, without GI and CI ids) may be chosen,
    /// since no one is to open them.
    pub what_if: bool,
    /// The GPUs out of allocation (drained, or unhealthy): none of them, nor any of their
    /// MIG instances, is handed out; nor a MIG instance its health took out alone.
    /// `None`: none is.
    pub fenced: Option<&'a crate::model::fence::Fences>,
}

impl<'a> Machine<'a> {
    /// The fence of the GPU (or MIG instance) with this UUID, if it has one.
    pub fn fence_of(&self, uuid: &str) -> Option<&'a crate::model::fence::Fence> {
        self.fenced?.of(uuid)
    }

    /// A machine without live figures and the default sharing limit.
    pub fn new(inventory: &'a Inventory, default_policy: PolicyName) -> Machine<'a> {
        Machine {
            inventory,
            live: None,
            default_policy,
            max_shared: 4,
            limits: None,
            processes: None,
            mig_units: crate::input::config::MigUnits::WholeOnly,
            what_if: false,
            fenced: None,
        }
    }
}
