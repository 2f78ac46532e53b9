//! The derived numbers rows carry, computed one way for every tool: rates per second, parts
//! per million, and `-` for what was not measured.

/// `count` per second of `secs`, to the thousandth: a float in JSON, so one event in a 2 s
/// window is 0.5, not 0.
pub fn per_s(count: u64, secs: f64) -> f64 {
    (count as f64 / secs * 1000.0).round() / 1000.0
}

/// `part` of `whole` in parts per million, rounded; 0 of nothing.
pub fn ppm(part: u64, whole: f64) -> u64 {
    if whole > 0.0 {
        (part as f64 * 1e6 / whole).round() as u64
    } else {
        0
    }
}

/// `ns` as a share of a window of `secs` (of one CPU's time), in parts per million.
pub fn window_ppm(ns: u64, secs: f64) -> u64 {
    ppm(ns, secs * 1e9)
}

/// A table cell: the value, or `-` where nothing was measured.
pub fn or_dash<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |x| x.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_shares_and_dashes() {
        assert_eq!(per_s(1, 2.0), 0.5);
        assert_eq!(per_s(3, 1.5), 2.0);
        assert_eq!(per_s(1, 3.0), 0.333);
        assert_eq!(ppm(1, 3.0), 333_333);
        assert_eq!(ppm(2, 3.0), 666_667);
        assert_eq!(ppm(5, 0.0), 0);
        assert_eq!(window_ppm(250_000_000, 2.0), 125_000);
        assert_eq!(or_dash(Some(7)), "7");
        assert_eq!(or_dash(None::<u64>), "-");
    }
}
