//! The ISO-8601 text of `oncely_sinks::native` against chrono, whose `%Y`
//! writes ISO-8601's expanded years as java.time does, over most of chrono's
//! range (±249,000 years; PostgreSQL's extremes are unit tests in
//! `native.rs`).

use oncely_sinks::native::{iso_date, iso_timestamp};
use proptest::prelude::*;

proptest! {
    /// Against chrono, whose `%Y` writes ISO-8601's expanded years too,
    /// over most of its range (±249,000 years).
    #[test]
    fn dates_match_chrono(days in -91_000_000_i64..91_000_000) {
        let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("epoch");
        let date = epoch + chrono::Duration::days(days);
        prop_assert_eq!(iso_date(days), date.format("%Y-%m-%d").to_string());
    }

    #[test]
    fn timestamps_match_chrono(micros in -7_800_000_000_000_000_000_i64..7_800_000_000_000_000_000) {
        let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1)
            .and_then(|d| d.and_hms_opt(0, 0, 0))
            .expect("epoch");
        let at = epoch + chrono::Duration::microseconds(micros);
        prop_assert_eq!(
            iso_timestamp(micros),
            at.format("%Y-%m-%dT%H:%M:%S%.6f").to_string()
        );
    }
}
