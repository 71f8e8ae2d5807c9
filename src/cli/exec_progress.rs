//! `gpupin exec --wait` on a terminal: while the request waits in the queue, one line on
//! stderr, redrawn in place, says its place, what it waits for and how long it has
//! waited; cleared when the wait ends. Read from the queue (read-only, as `gpupin queue`
//! reads it), so it works whether root allocates or `gpupin serve` does.

use gpupin::input::config::Config;
use gpupin::state::ledger::{Ledger, Waiting};
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

/// How often the line is redrawn.
const EVERY: Duration = Duration::from_millis(500);

/// The reporter; `stop` ends it (and clears its line).
pub struct Progress {
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Progress {
    /// Starts reporting the wait of `holder` where it can be shown: a wait was asked and
    /// stderr is a terminal. Nothing otherwise.
    pub fn start(config: &Config, holder: String, waits: bool) -> Progress {
        let done = Arc::new(AtomicBool::new(false));
        if !waits || !std::io::stderr().is_terminal() {
            return Progress { done, thread: None };
        }
        let config = config.clone();
        let flag = Arc::clone(&done);
        let thread = std::thread::Builder::new()
            .name("gpupin-progress".into())
            .spawn(move || report(&config, &holder, &flag))
            .ok();
        Progress { done, thread }
    }

    pub fn stop(mut self) {
        self.done.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn report(config: &Config, holder: &str, done: &AtomicBool) {
    let mut shown = false;
    while !done.load(Ordering::SeqCst) {
        let waiting = Ledger::read_only_for_config(config)
            .and_then(|l| l.waiting())
            .unwrap_or_default();
        if let Some(line) = line(&waiting, holder, SystemTime::now()) {
            // Carriage return and clear to the end: the line is redrawn in place.
            let _ = write!(std::io::stderr().lock(), "\r\x1b[K{line}");
            shown = true;
        }
        std::thread::sleep(EVERY);
    }
    if shown {
        let _ = write!(std::io::stderr().lock(), "\r\x1b[K");
    }
}

/// `gpupin: waiting for count=2 (2nd in the queue, 1 ahead), 1m 20s`; `None` while the
/// request is not (or no longer) in the queue.
pub fn line(waiting: &[Waiting], holder: &str, now: SystemTime) -> Option<String> {
    let position = waiting.iter().position(|w| w.holder == holder)?;
    let me = &waiting[position];
    let since = gpupin::base::clock::unix(me.queued_at);
    let waited = now.duration_since(since).unwrap_or_default().as_secs();
    let place = match position {
        0 => "first in the queue".to_string(),
        n => format!("{} ahead in the queue", n),
    };
    Some(format!(
        "gpupin: waiting for {} ({place}), {}",
        me.request,
        humantime::format_duration(Duration::from_secs(waited))
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(holder: &str, queued_at: u64) -> Waiting {
        Waiting {
            holder: holder.into(),
            queued_at,
            name: None,
            user: None,
            request: "count=2".into(),
            parked: false,
            pid: None,
        }
    }

    #[test]
    fn the_line_says_the_place_the_request_and_the_wait() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1000);
        let queue = [waiting("a", 900), waiting("me", 920)];
        assert_eq!(
            line(&queue, "me", now).unwrap(),
            "gpupin: waiting for count=2 (1 ahead in the queue), 1m 20s"
        );
        assert_eq!(
            line(&queue, "a", now).unwrap(),
            "gpupin: waiting for count=2 (first in the queue), 1m 40s"
        );
        assert_eq!(line(&queue, "gone", now), None);
    }
}
