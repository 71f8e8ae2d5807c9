//! `gpupin reset`'s hold on the health watch. The driver refuses to reset a GPU while any
//! process has it open, NVML's clients included ("In use by another client"), and the
//! watch keeps NVML open for its events. While paused, the watch lets go of NVML; it
//! takes it again when resumed, or by itself when the pause runs out (a reset that died
//! halfway leaves the GPUs watched again).

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The longest pause one request may ask for: `nvidia-smi --gpu-reset` takes seconds.
pub(crate) const MAX_PAUSE: Duration = Duration::from_secs(600);

#[derive(Default)]
pub(super) struct HealthPause {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// Paused until then.
    until: Option<Instant>,
    /// The watch has NVML open now.
    holding: bool,
}

impl HealthPause {
    /// Pauses the watch for `span` (at most `MAX_PAUSE`) and waits up to `patience` for
    /// it to let go of NVML; whether it did.
    pub(super) fn pause(&self, span: Duration, patience: Duration) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.until = Some(Instant::now() + span.min(MAX_PAUSE));
        let (state, _) = self
            .changed
            .wait_timeout_while(state, patience, |s| s.holding)
            .unwrap_or_else(|e| e.into_inner());
        !state.holding
    }

    /// Ends the pause: the watch takes NVML again.
    pub(super) fn resume(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).until = None;
    }

    /// Whether the watch must not hold NVML now.
    pub(super) fn paused(&self) -> bool {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.until.is_some_and(|until| Instant::now() < until)
    }

    /// The watch says whether it holds NVML open.
    pub(super) fn holding(&self, holding: bool) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).holding = holding;
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_pause_waits_for_the_watch_to_let_go_and_ends_by_itself() {
        let pause = Arc::new(HealthPause::default());
        // No watch holds NVML: paused at once.
        assert!(pause.pause(Duration::from_millis(300), Duration::ZERO));
        assert!(pause.paused());
        std::thread::sleep(Duration::from_millis(350));
        assert!(!pause.paused(), "ran out");

        pause.holding(true);
        assert!(
            !pause.pause(Duration::from_secs(60), Duration::from_millis(50)),
            "a watch that holds on is not waited for forever"
        );
        let watch = {
            let pause = Arc::clone(&pause);
            std::thread::spawn(move || {
                while !pause.paused() {
                    std::thread::sleep(Duration::from_millis(10));
                }
                pause.holding(false);
            })
        };
        assert!(pause.pause(Duration::from_secs(60), Duration::from_secs(30)));
        watch.join().unwrap();
        pause.resume();
        assert!(!pause.paused());
    }
}
