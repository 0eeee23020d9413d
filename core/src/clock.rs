//! The wall clock as the wire and the signal ids use it.

/// Milliseconds since the Unix epoch, now (0 if the clock is before it,
/// `i64::MAX` past the year 292 million).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    #[test]
    fn now_is_after_2020_and_does_not_go_back() {
        let a = super::now_ms();
        assert!(a > 1_577_836_800_000, "{a}");
        assert!(super::now_ms() >= a);
    }
}
