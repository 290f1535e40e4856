//! Times as the console shows them. The server stores RFC 3339 UTC strings; the console
//! needs durations between them, in the browser (wasm) as on the server, so this parses
//! them itself rather than pulling a date crate into the bundle.

/// Milliseconds since the Unix epoch of an RFC 3339 UTC time (`…Z`, optional fraction).
pub fn parse_millis(s: &str) -> Option<i64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut dp = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, d) = (dp.next()??, dp.next()??, dp.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut tp = hms.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (hh, mm, ss) = (tp.next()??, tp.next()??, tp.next()??);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    let millis: i64 = format!("{frac:0<3}").get(..3)?.parse().ok()?;
    let days = days_from_civil(y, m, d);
    Some(((days * 86_400 + hh * 3600 + mm * 60 + ss) * 1000) + millis)
}

// Howard Hinnant's civil-date algorithms (public domain). The server formats its
// timestamps with these too, so the one calendar lives here, compiled on both sides.

/// Days since the Unix epoch of a proleptic Gregorian date.
pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date (year, month, day) `z` days after the Unix epoch.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// A duration for people: `850 ms`, `42 s`, `3 min 05 s`, `2 h 07 min`.
pub fn format_duration(millis: i64) -> String {
    let millis = millis.max(0);
    if millis < 1000 {
        return format!("{millis} ms");
    }
    let secs = millis / 1000;
    match secs {
        0..60 => format!("{secs} s"),
        60..3600 => format!("{} min {:02} s", secs / 60, secs % 60),
        _ => format!("{} h {:02} min", secs / 3600, (secs % 3600) / 60),
    }
}

/// How long something ran: from `start` to `end`, or to `now` while it still runs.
/// `None` when it has not started, or when it runs and no clock is known yet (the
/// server's render and the browser's first render must agree, so neither reads a clock).
pub fn elapsed(start: Option<&str>, end: Option<&str>, now: Option<i64>) -> Option<String> {
    let start = parse_millis(start?)?;
    let end = match end {
        Some(e) => parse_millis(e)?,
        None => now?,
    };
    Some(format_duration(end - start))
}

/// `2026-11-30T01:54:44.123Z` as `2026-11-30 01:54:44 UTC`: compact, and unambiguous
/// whatever the viewer's time zone.
pub fn short(s: &str) -> String {
    match s.split_once('T') {
        Some((date, time)) => {
            let hms = time.trim_end_matches('Z');
            let hms = hms.split('.').next().unwrap_or(hms);
            format!("{date} {hms} UTC")
        }
        None => s.to_owned(),
    }
}

/// The browser's clock, in milliseconds since the epoch.
#[cfg(feature = "hydrate")]
pub fn browser_now() -> i64 {
    js_sys::Date::now() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_the_server_writes() {
        assert_eq!(parse_millis("1970-01-01T00:00:00.000Z"), Some(0));
        assert_eq!(parse_millis("1970-01-01T00:00:01Z"), Some(1000));
        assert_eq!(
            parse_millis("2000-03-01T00:00:00.5Z"),
            Some(951_868_800_500)
        );
        assert_eq!(
            parse_millis("2026-11-30T01:54:44.123Z"),
            Some(1_796_003_684_123)
        );
        for bad in [
            "",
            "2026-11-30",
            "2026-11-30T01:54:44",
            "2026-13-01T00:00:00Z",
            "x",
        ] {
            assert_eq!(parse_millis(bad), None, "{bad}");
        }
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(format_duration(850), "850 ms");
        assert_eq!(format_duration(42_000), "42 s");
        assert_eq!(format_duration(185_000), "3 min 05 s");
        assert_eq!(format_duration(7_620_000), "2 h 07 min");
        assert_eq!(format_duration(-5), "0 ms");
    }

    #[test]
    fn elapsed_needs_a_clock_only_while_running() {
        let start = Some("2026-11-30T01:00:00.000Z");
        assert_eq!(
            elapsed(start, Some("2026-11-30T01:00:12.000Z"), None).as_deref(),
            Some("12 s")
        );
        assert_eq!(elapsed(start, None, None), None);
        let now = parse_millis("2026-11-30T01:01:00.000Z");
        assert_eq!(elapsed(start, None, now).as_deref(), Some("1 min 00 s"));
        assert_eq!(elapsed(None, None, now), None);
        assert_eq!(short("2026-11-30T01:54:44.123Z"), "2026-11-30 01:54:44 UTC");
    }
}
