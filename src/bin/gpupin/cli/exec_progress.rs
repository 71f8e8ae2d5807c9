//! `gpupin exec --wait`: while the request waits in the queue, one line on stderr says
//! what it waits for, why (as its ticket says: its own limit, its group's, no free GPU
//! of its kind, too few free, waiters ahead of it) and how long it has waited. On a
//! terminal it is redrawn in place and cleared when the wait ends; elsewhere (a batch
//! job's log) a line is printed when the wait is first seen and each time its reason
//! changes. Read from the queue (read-only, as `gpupin queue` reads it), so it works
//! whether root allocates or `gpupin serve` does.

use gpupin::command::{Config, Ledger, WaitReason, Waiting};
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
    /// Starts reporting the wait of `holder`, where a wait was asked. Nothing otherwise.
    pub fn start(config: &Config, holder: String, waits: bool) -> Progress {
        let done = Arc::new(AtomicBool::new(false));
        if !waits {
            return Progress { done, thread: None };
        }
        let terminal = std::io::stderr().is_terminal();
        let config = config.clone();
        let flag = Arc::clone(&done);
        let thread = std::thread::Builder::new()
            .name("gpupin-progress".into())
            .spawn(move || match terminal {
                true => redraw(&config, &holder, &flag),
                false => on_change(&config, &holder, &flag),
            })
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

fn queue(config: &Config) -> Vec<Waiting> {
    Ledger::open_read_only(&config.ledger_settings())
        .and_then(|l| l.waiting())
        .unwrap_or_default()
}

/// On a terminal: the line redrawn in place, cleared at the end.
fn redraw(config: &Config, holder: &str, done: &AtomicBool) {
    let mut shown = false;
    while !done.load(Ordering::SeqCst) {
        if let Some(line) = line(&queue(config), holder, SystemTime::now()) {
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

/// Elsewhere: a line once the waiter's first look said why it waits, and each time the
/// reason changes; the line's clock alone changes nothing.
fn on_change(config: &Config, holder: &str, done: &AtomicBool) {
    let mut last: Option<WaitReason> = None;
    while !done.load(Ordering::SeqCst) {
        if let Some((line, reason)) = changed_line(&queue(config), holder, &last, SystemTime::now())
        {
            let _ = writeln!(std::io::stderr().lock(), "{line}");
            last = Some(reason);
        }
        std::thread::sleep(EVERY);
    }
}

/// The line a log gets now, with the reason it says, when the request waits for a reason
/// other than `last`. Nothing before the waiter's first look: a request that look refuses
/// outright (no wait can help it) leaves one line, its refusal, not a wait that never was.
fn changed_line(
    waiting: &[Waiting],
    holder: &str,
    last: &Option<WaitReason>,
    now: SystemTime,
) -> Option<(String, WaitReason)> {
    let me = waiting.iter().find(|w| w.holder == holder)?;
    let reason = me.reason.clone().filter(|r| Some(r) != last.as_ref())?;
    Some((line(waiting, holder, now)?, reason))
}

/// `gpupin: waiting for count=2 (own limit), 1m 20s`: why it waits, as its ticket says;
/// before its waiter's first look, its place (`first in the queue`, `1 ahead in the
/// queue`). `None` while the request is not (or no longer) in the queue.
pub fn line(waiting: &[Waiting], holder: &str, now: SystemTime) -> Option<String> {
    let position = waiting.iter().position(|w| w.holder == holder)?;
    let me = &waiting[position];
    let since = gpupin::command::clock::unix(me.queued_at);
    let waited = now.duration_since(since).unwrap_or_default().as_secs();
    let place = match (&me.reason, position) {
        (Some(reason), _) => reason.to_string(),
        (None, 0) => "first in the queue".to_string(),
        (None, n) => format!("{} ahead in the queue", n),
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
            reason: None,
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

    #[test]
    fn a_log_gets_a_line_once_the_waiter_looked_and_again_only_when_the_reason_changes() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1000);
        let mut me = waiting("me", 920);
        assert_eq!(changed_line(&[me.clone()], "me", &None, now), None);
        me.reason = Some(WaitReason::TooFewFree);
        let (first, said) = changed_line(&[me.clone()], "me", &None, now).unwrap();
        assert_eq!(
            first,
            "gpupin: waiting for count=2 (too few GPUs free), 1m 20s"
        );
        assert_eq!(
            changed_line(&[me.clone()], "me", &Some(said.clone()), now),
            None
        );
        me.reason = Some(WaitReason::OwnLimit);
        assert!(changed_line(&[me], "me", &Some(said), now).is_some());
        assert_eq!(changed_line(&[], "me", &None, now), None);
    }

    #[test]
    fn the_line_says_why_the_request_waits_once_its_waiter_looked() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1000);
        let mut me = waiting("me", 920);
        me.reason = Some(WaitReason::OwnLimit);
        let queue = [waiting("a", 900), me];
        assert_eq!(
            line(&queue, "me", now).unwrap(),
            "gpupin: waiting for count=2 (own limit), 1m 20s"
        );
    }
}
