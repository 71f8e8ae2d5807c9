//! What a GPU's health says, and what gpupin does about it: an XID by the action NVIDIA's
//! XID catalog names for it (ignore, restart the app, reset the GPU, reboot the machine;
//! overridable per XID), a double-bit ECC error, a pending or failed row remap, retired
//! pages pending, a GPU fallen off the bus, and the driver's own word on what the GPU
//! needs (NVML's GPU recovery action). A reset or a reboot is a fence (`model::fence`):
//! the GPU goes to no one until then; restart-app is told (the audit log), not fenced.

use super::fence::FenceState;
use std::collections::BTreeMap;

/// What the driver reported of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    /// An XID event (NVML's critical XID event), with its number.
    Xid(u64),
    /// A double-bit (uncorrectable) ECC error: an event, or the volatile counter above 0.
    DoubleBitEcc,
    /// A row is marked for remapping; the remap happens at the next reset.
    RemapPending,
    /// Row remapping failed: the GPU is out of spare rows.
    RemapFailed,
    /// Pages are marked for retirement, which takes effect at the next reset.
    RetiredPagesPending,
    /// NVML answers that the GPU has fallen off the bus (GPU_IS_LOST).
    Lost,
    /// The driver's GPU recovery action (nvml.h's `nvmlDeviceGpuRecoveryAction_t`, read
    /// as the field `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`), other than none: what it says
    /// the GPU needs before it is used again. It reads none again once that was done.
    Recovery(u32),
}

/// What a signal calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    /// Nothing: logged at debug level only.
    Ignore,
    /// The application that hit it must restart; the GPU is fine: an audit line, no fence.
    RestartApp,
    /// The GPU needs a reset before anyone uses it again.
    Reset,
    /// The machine needs a reboot.
    Reboot,
}

impl Action {
    /// The word the config and the audit log use.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Ignore => "ignore",
            Action::RestartApp => "restart-app",
            Action::Reset => "reset",
            Action::Reboot => "reboot",
        }
    }

    pub fn parse(text: &str) -> Option<Action> {
        [
            Action::Ignore,
            Action::RestartApp,
            Action::Reset,
            Action::Reboot,
        ]
        .into_iter()
        .find(|a| a.as_str() == text)
    }

    /// The fence it sets, if any.
    pub fn fence(self) -> Option<FenceState> {
        match self {
            Action::Ignore | Action::RestartApp => None,
            Action::Reset => Some(FenceState::NeedsReset),
            Action::Reboot => Some(FenceState::NeedsReboot),
        }
    }
}

/// The action for an XID, from the immediate action NVIDIA's XID catalog gives it (for
/// Ampere and newer GPUs), for the XIDs gpupin knows; any other XID restarts the app
/// (told, not fenced). `[health] xid` in the config overrides any of them.
pub(crate) fn xid_action(xid: u64) -> Action {
    match xid {
        // IGNORE in the catalog: a preemptive cleanup after another error (45), a channel
        // reset check (43), a row remap recorded or a high single-bit ECC rate (63, 92:
        // the remap pending the poll reads fences the GPU until its reset), and the driver
        // announcing a new recovery action (154: the poll reads the action itself).
        43 | 45 | 63 | 92 | 154 => Action::Ignore,
        // RESTART_APP: the application's own fault or a channel it lost (GPU stopped
        // processing, graphics engine exception, MMU page fault, engine timeouts, a
        // contained ECC error).
        8 | 13 | 31 | 32 | 68 | 69 | 94 => Action::RestartApp,
        // RESET_GPU: the GPU's state is damaged until a reset: stopped processing,
        // double-bit ECC error, internal microcontroller halt, row remapping failed,
        // NVLink error, uncontained ECC error, context switch timeout, security fault,
        // GSP errors, link training failed, GPU initialisation error, NVLink5 NVLPW,
        // NVLink software-defined error, resource retirement, fatal timeout.
        46 | 48 | 62 | 64 | 74 | 95 | 109 | 110 | 119 | 120 | 136 | 140 | 143 | 150 | 155 | 156
        | 158 => Action::Reset,
        // RESTART_BM: the GPU has fallen off the bus.
        79 => Action::Reboot,
        _ => Action::RestartApp,
    }
}

/// The clock slowdowns NVML reports (its throttle reason bits) that say something about
/// the GPU's health, in words: hardware slowdown, thermal (hardware or software), power
/// brake. A power cap under load is normal and left out.
pub(crate) fn slowdowns(bits: u64) -> Vec<&'static str> {
    const WORDS: [(u64, &str); 4] = [
        (0x8, "hardware slowdown"),
        (0x20, "thermal slowdown (software)"),
        (0x40, "thermal slowdown (hardware)"),
        (0x80, "power brake slowdown"),
    ];
    WORDS
        .iter()
        .filter(|(bit, _)| bits & bit != 0)
        .map(|(_, word)| *word)
        .collect()
}

/// What gpupin makes of `signal`: its action (per XID, `overrides` first) and the reason a
/// fence or an audit line gives.
pub(crate) fn judge(signal: Signal, overrides: &BTreeMap<u64, Action>) -> (Action, String) {
    match signal {
        Signal::Xid(xid) => {
            let action = overrides
                .get(&xid)
                .copied()
                .unwrap_or_else(|| xid_action(xid));
            (action, format!("XID {xid}"))
        }
        Signal::DoubleBitEcc => (Action::Reset, "double-bit ECC error".into()),
        Signal::RemapPending => (Action::Reset, "row remap pending".into()),
        Signal::RemapFailed => (Action::Reset, "row remapping failed".into()),
        Signal::RetiredPagesPending => (Action::Reset, "retired pages pending".into()),
        Signal::Lost => (Action::Reboot, "fallen off the bus".into()),
        Signal::Recovery(code) => {
            let (action, what) = match code {
                1 => (Action::Reset, "a GPU reset".to_string()),
                2 => (Action::Reboot, "a node reboot".into()),
                3 => (Action::Reset, "peer-to-peer traffic drained".into()),
                4 => (
                    Action::Reset,
                    "peer-to-peer traffic drained and a GPU reset".into(),
                ),
                5 => (Action::Reset, "its IMEX domain recovered".into()),
                6 => (Action::Reset, "a PCIe bus reset".into()),
                7 => (Action::Reboot, "a system reboot".into()),
                // A newer driver's action gpupin does not know: out until it reads none.
                other => (Action::Reset, format!("recovery action {other}")),
            };
            (action, format!("the driver asks for {what}"))
        }
    }
}

/// Whether a health fence in `state` set by an event (an XID, told once) should from now
/// on follow `condition`, which the GPU reports until it is reset: the condition asks for
/// as much as the fence (a reset condition does not carry a fence that asked for a
/// reboot). Then the fence goes when the condition does, which is how a reset shows.
pub(crate) fn follows(state: FenceState, condition: Action) -> bool {
    condition.fence().is_some_and(|asked| asked >= state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xids_take_the_catalogs_action_unless_the_config_says_otherwise() {
        let none = BTreeMap::new();
        assert_eq!(
            judge(Signal::Xid(79), &none),
            (Action::Reboot, "XID 79".into())
        );
        assert_eq!(judge(Signal::Xid(48), &none).0, Action::Reset);
        assert_eq!(judge(Signal::Xid(13), &none).0, Action::RestartApp);
        assert_eq!(judge(Signal::Xid(45), &none).0, Action::Ignore);
        for (xid, action) in [
            (43, Action::Ignore),
            (63, Action::Ignore),
            (92, Action::Ignore),
            (154, Action::Ignore),
            (94, Action::RestartApp),
            (109, Action::Reset),
            (143, Action::Reset),
            (158, Action::Reset),
            (95, Action::Reset),
        ] {
            assert_eq!(judge(Signal::Xid(xid), &none).0, action, "XID {xid}");
        }
        assert_eq!(judge(Signal::Xid(9999), &none).0, Action::RestartApp);
        let mine = BTreeMap::from([(13, Action::Reset), (79, Action::Ignore)]);
        assert_eq!(judge(Signal::Xid(13), &mine).0, Action::Reset);
        assert_eq!(judge(Signal::Xid(79), &mine).0, Action::Ignore);
        assert_eq!(judge(Signal::Xid(48), &mine).0, Action::Reset);
    }

    #[test]
    fn the_drivers_recovery_action_fences_as_it_asks() {
        let none = BTreeMap::new();
        assert_eq!(
            judge(Signal::Recovery(1), &none),
            (Action::Reset, "the driver asks for a GPU reset".into())
        );
        assert_eq!(judge(Signal::Recovery(2), &none).0, Action::Reboot);
        assert_eq!(judge(Signal::Recovery(7), &none).0, Action::Reboot);
        for code in [3, 4, 5, 6, 42] {
            assert_eq!(
                judge(Signal::Recovery(code), &none).0,
                Action::Reset,
                "{code}"
            );
        }
        assert_eq!(
            judge(Signal::Recovery(42), &none).1,
            "the driver asks for recovery action 42"
        );
    }

    #[test]
    fn an_xid_fence_follows_a_condition_that_asks_as_much() {
        assert!(follows(FenceState::NeedsReset, Action::Reset));
        assert!(follows(FenceState::NeedsReset, Action::Reboot));
        assert!(follows(FenceState::NeedsReboot, Action::Reboot));
        assert!(!follows(FenceState::NeedsReboot, Action::Reset));
        assert!(!follows(FenceState::NeedsReset, Action::RestartApp));
        assert!(!follows(FenceState::NeedsReset, Action::Ignore));
    }

    #[test]
    fn slowdowns_are_named_and_a_power_cap_is_not_one() {
        assert_eq!(slowdowns(0), Vec::<&str>::new());
        assert_eq!(slowdowns(0x4), Vec::<&str>::new(), "power cap");
        assert_eq!(slowdowns(0x40), ["thermal slowdown (hardware)"]);
        assert_eq!(
            slowdowns(0x8 | 0x20 | 0x80 | 0x4),
            [
                "hardware slowdown",
                "thermal slowdown (software)",
                "power brake slowdown"
            ]
        );
    }

    #[test]
    fn memory_errors_need_a_reset_and_only_resets_and_reboots_fence() {
        for s in [
            Signal::DoubleBitEcc,
            Signal::RemapPending,
            Signal::RemapFailed,
            Signal::RetiredPagesPending,
        ] {
            assert_eq!(judge(s, &BTreeMap::new()).0, Action::Reset, "{s:?}");
        }
        assert_eq!(
            judge(Signal::Lost, &BTreeMap::new()),
            (Action::Reboot, "fallen off the bus".into())
        );
        assert_eq!(Action::Reset.fence(), Some(FenceState::NeedsReset));
        assert_eq!(Action::Reboot.fence(), Some(FenceState::NeedsReboot));
        assert_eq!(Action::RestartApp.fence(), None);
        assert_eq!(Action::Ignore.fence(), None);
        for a in [
            Action::Ignore,
            Action::RestartApp,
            Action::Reset,
            Action::Reboot,
        ] {
            assert_eq!(Action::parse(a.as_str()), Some(a));
        }
        assert_eq!(Action::parse("drain"), None);
    }
}
