//! Numbers as people write them in workload specs: sizes (`4k`, `1.5GiB`), counts (`1e6`,
//! `1_000_000`), percentages (`70`, `70%`) and rates.
//!
//! [`parse_size`] is the workspace's one size parser (it lives in the engine, next to the
//! cache-size parser); it is re-exported here so that users of the workload module and the
//! CLI have a single place to find it. Percentages are deliberately not sizes: see
//! [`parse_percent`].

pub use tiercache_engine::units::{parse_size, SizeError};

/// Parses a non-negative integer count: `1000000`, `1_000_000`, `1e6`, `2.5e6`.
///
/// Scientific or decimal notation must denote a whole number (`1.5` is an error).
pub fn parse_count(s: &str) -> Result<u64, String> {
    let t = s.trim().replace('_', "");
    if t.is_empty() {
        return Err("empty number".into());
    }
    if let Ok(v) = t.parse::<u64>() {
        return Ok(v);
    }
    if t.starts_with('-') {
        return Err(format!("'{s}' is negative"));
    }
    let v: f64 = t
        .parse()
        .map_err(|_| format!("'{s}' is not a number (examples: 1000000, 1_000_000, 1e6)"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("'{s}' is out of range"));
    }
    if v.fract() != 0.0 {
        return Err(format!("'{s}' is not a whole number"));
    }
    // 2^53: every integer below is exact in f64.
    if v > 9_007_199_254_740_992.0 {
        return Err(format!("'{s}' is too large; write it as an integer"));
    }
    Ok(v as u64)
}

/// Parses a percentage between 0 and 100 inclusive; the `%` sign is optional (`70`, `70%`,
/// `12.5 %`).
pub fn parse_percent(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let t = t.strip_suffix('%').unwrap_or(t).trim();
    let v: f64 = t
        .parse()
        .map_err(|_| format!("'{s}' is not a percentage (examples: 70, 70%, 12.5%)"))?;
    if !(0.0..=100.0).contains(&v) {
        return Err(format!("{s} is not a percentage between 0 and 100"));
    }
    Ok(v)
}

/// Parses a positive finite decimal number (`1000`, `1e5`, `0.5`, `1_000`).
pub fn parse_positive(s: &str) -> Result<f64, String> {
    let t = s.trim().replace('_', "");
    let v: f64 = t.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("'{s}' must be a number above 0"));
    }
    Ok(v)
}

/// Formats a byte count exactly, with the largest binary unit that divides it: `4KiB`,
/// `1536MiB`, `1GiB`, `4097`. The result parses back to the same value with [`parse_size`].
pub fn fmt_size_exact(bytes: u64) -> String {
    const UNITS: [(&str, u32); 5] = [
        ("PiB", 50),
        ("TiB", 40),
        ("GiB", 30),
        ("MiB", 20),
        ("KiB", 10),
    ];
    if bytes == 0 {
        return "0".into();
    }
    for (name, shift) in UNITS {
        if bytes.trailing_zeros() >= shift {
            return format!("{}{name}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        for (s, v) in [
            ("4096", 4096),
            ("4k", 4096),
            ("4KiB", 4096),
            ("1m", 1 << 20),
            ("1MiB", 1 << 20),
            ("1g", 1 << 30),
            ("1GiB", 1 << 30),
            ("1.5GiB", 3 << 29),
            ("1_048_576", 1 << 20),
        ] {
            assert_eq!(parse_size(s).unwrap(), v, "{s}");
        }
        for bad in ["", "k", "4q", "1.2.3k", "-4k", "10%"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn counts() {
        assert_eq!(parse_count("1000000").unwrap(), 1_000_000);
        assert_eq!(parse_count("1_000_000").unwrap(), 1_000_000);
        assert_eq!(parse_count("1e6").unwrap(), 1_000_000);
        assert_eq!(parse_count("2.5E3").unwrap(), 2500);
        assert_eq!(parse_count("0").unwrap(), 0);
        for bad in ["", "1.5", "-3", "x", "1e400", "1e30"] {
            assert!(parse_count(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn percents() {
        assert_eq!(parse_percent("70").unwrap(), 70.0);
        assert_eq!(parse_percent("70%").unwrap(), 70.0);
        assert_eq!(parse_percent(" 12.5 % ").unwrap(), 12.5);
        assert_eq!(parse_percent("0").unwrap(), 0.0);
        assert_eq!(parse_percent("100").unwrap(), 100.0);
        for bad in ["150", "-1", "x", "", "NaN"] {
            assert!(parse_percent(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn exact_sizes_round_trip() {
        for v in [
            1u64,
            512,
            4096,
            4097,
            3 << 29,
            1 << 30,
            (1 << 40) + 4096,
            5 << 50,
        ] {
            let s = fmt_size_exact(v);
            assert_eq!(parse_size(&s).unwrap(), v, "{s}");
        }
        assert_eq!(fmt_size_exact(4096), "4KiB");
        assert_eq!(fmt_size_exact(3 << 29), "1536MiB");
    }
}
