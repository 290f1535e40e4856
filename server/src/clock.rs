//! Timestamps as RFC 3339 UTC strings with millisecond precision. Both stores keep them
//! as text so SQLite and PostgreSQL sort and compare them the same way.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub fn now() -> String {
    format_time(SystemTime::now())
}

/// `t` plus `d`, formatted.
pub fn after(d: Duration) -> String {
    format_time(SystemTime::now() + d)
}

/// A unique id that sorts by creation time: `prefix-`, the milliseconds since the epoch,
/// then 64 random bits (all hex), so ids made in one millisecond on two replicas differ.
pub fn sortable_id(prefix: &str) -> String {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let mut random = [0u8; 8];
    // A failed read leaves zeros: still unique enough with the timestamp for audit rows,
    // and the store's primary key refuses a real collision.
    let _ = getrandom::fill(&mut random);
    format!("{prefix}-{millis:012x}{:016x}", u64::from_le_bytes(random))
}

pub fn format_time(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = app::time::civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// Parses what `format_time` writes (and RFC 3339 `Z` times without fractions).
pub fn parse_time(s: &str) -> Option<SystemTime> {
    let millis = u64::try_from(app::time::parse_millis(s)?).ok()?;
    Some(UNIX_EPOCH + Duration::from_millis(millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(format_time(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_798_502_400_123);
        assert_eq!(format_time(t), "2026-12-29T00:00:00.123Z");
        assert_eq!(
            format_time(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00.000Z"
        );
    }

    #[test]
    fn round_trips() {
        let now = SystemTime::now();
        let s = format_time(now);
        let back = parse_time(&s).unwrap();
        let diff = now.duration_since(back).unwrap_or_default();
        assert!(diff < Duration::from_millis(1));
        assert_eq!(
            parse_time("2026-11-29T22:55:56Z")
                .map(format_time)
                .as_deref(),
            Some("2026-11-29T22:55:56.000Z")
        );
        assert!(parse_time("yesterday").is_none());
    }
}
