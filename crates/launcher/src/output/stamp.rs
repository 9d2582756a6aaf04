//! `--timestamp-output`: the UTC time a line reached rlaunch, as `[2026-11-22T10:00:00.123Z] `,
//! formatted by hand (civil-from-days) so that no date crate is needed.

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

/// The stamp of the current millisecond, formatted again only when the millisecond changes.
#[derive(Default)]
pub(crate) struct Clock {
    last_ms: u64,
    text: Vec<u8>,
}

impl Clock {
    /// The stamp for a line received now, trailing space included.
    pub(crate) fn now(&mut self) -> &[u8] {
        let ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        // Never backwards: a step of the system clock must not make later lines look older.
        let ms = ms.max(self.last_ms);
        if ms != self.last_ms || self.text.is_empty() {
            self.last_ms = ms;
            self.text.clear();
            write_stamp(ms, &mut self.text);
        }
        &self.text
    }
}

/// Appends `[YYYY-MM-DDTHH:MM:SS.mmmZ] ` for `ms` milliseconds after the Unix epoch.
pub(crate) fn write_stamp(ms: u64, out: &mut Vec<u8>) {
    let secs = ms / 1000;
    let (year, month, day) = civil_from_days(secs / 86_400);
    let of_day = secs % 86_400;
    let (hour, minute, second) = (of_day / 3600, of_day / 60 % 60, of_day % 60);
    // Writing into a Vec cannot fail.
    let _ = write!(
        out,
        "[{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{:03}Z] ",
        ms % 1000
    );
}

/// Year, month (1-12) and day (1-31) of the `days`-th day after 1970-01-01, in the proleptic
/// Gregorian calendar (Howard Hinnant's `civil_from_days`, for days on or after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Count from 0000-03-01, so that the leap day ends each 400-year era and each year.
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    // Months from March: 0 is March, 11 is February.
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 { month_from_march + 3 } else { month_from_march - 9 };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(ms: u64) -> String {
        let mut out = Vec::new();
        write_stamp(ms, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn known_instants_format_as_date_says() {
        // Seconds from `date -u -d ... +%s`.
        let known = [
            (0, "[1970-01-01T00:00:00.000Z] "),
            (1_795_341_600_123, "[2026-11-22T10:00:00.123Z] "),
            (951_868_799_999, "[2000-02-29T23:59:59.999Z] "),
            (951_868_800_000, "[2000-03-01T00:00:00.000Z] "),
            (946_684_799_001, "[1999-12-31T23:59:59.001Z] "),
            (1_735_689_599_000, "[2024-12-31T23:59:59.000Z] "),
            (4_107_499_200_000, "[2100-02-28T12:00:00.000Z] "),
            (4_107_542_400_000, "[2100-03-01T00:00:00.000Z] "),
            (253_402_300_799_999, "[9999-12-31T23:59:59.999Z] "),
        ];
        for (ms, text) in known {
            assert_eq!(stamp(ms), text, "{ms} ms");
        }
    }

    #[test]
    fn consecutive_days_are_consecutive_dates() {
        // Spelled as a match: `is_multiple_of` is newer than the workspace's rust-version.
        let leap = |y: u64| match (y % 400, y % 100, y % 4) {
            (0, _, _) => true,
            (_, 0, _) => false,
            (_, _, rest) => rest == 0,
        };
        let mut date = (1970, 1, 1);
        for days in 0..200_000 {
            assert_eq!(civil_from_days(days), date, "day {days}");
            let (y, m, d) = date;
            let month_len = match m {
                2 if leap(y) => 29,
                2 => 28,
                4 | 6 | 9 | 11 => 30,
                _ => 31,
            };
            date = match (m, d) {
                (12, 31) => (y + 1, 1, 1),
                (_, d) if d == month_len => (y, m + 1, 1),
                _ => (y, m, d + 1),
            };
        }
    }

    #[test]
    fn the_clock_never_goes_back() {
        let mut clock = Clock { last_ms: u64::MAX / 2, text: Vec::new() };
        let first = clock.now().to_vec();
        assert_eq!(clock.now(), &first[..]);
        assert!(first.starts_with(b"[") && first.ends_with(b"Z] "));
    }
}
