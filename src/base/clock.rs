//! Times kept as seconds since the Unix epoch (records, tickets, audit lines, requests)
//! turned back into `SystemTime`. Such a number is data that another process wrote or a
//! caller sent: `UNIX_EPOCH + Duration::from_secs(n)` panics past what `SystemTime` holds,
//! and RFC 3339 ends with the year 9999, so every such time is read through `unix`, which
//! never goes past that last second.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// 9999-12-31T23:59:59Z, the last second RFC 3339 (and `humantime`) can write.
pub(crate) const LATEST_UNIX_SECS: u64 = 253_402_300_799;

/// `secs` since the epoch, held to `LATEST_UNIX_SECS`.
pub fn unix(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs.min(LATEST_UNIX_SECS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_past_the_year_9999_is_its_last_second_and_prints() {
        for secs in [LATEST_UNIX_SECS + 1, u64::MAX] {
            let time = unix(secs);
            assert_eq!(
                humantime::format_rfc3339_seconds(time).to_string(),
                "9999-12-31T23:59:59Z"
            );
        }
        assert_eq!(unix(60), UNIX_EPOCH + Duration::from_secs(60));
    }
}
