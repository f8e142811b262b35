//! Parsing sizes and counts as people write them: `4096`, `4k`, `4KiB`, `1.5GiB`, `10%`.

use std::fmt;

/// A size could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{input}' is not a size: {why} (examples: 4096, 4k, 64KiB, 1MiB, 1.5GiB)")]
pub struct SizeError {
    pub input: String,
    pub why: &'static str,
}

/// Parses a byte size. Suffixes are binary (k = KiB = 1024); `B` is optional.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let err = |why| SizeError {
        input: s.to_string(),
        why,
    };
    let t = s.trim().replace('_', "");
    if t.is_empty() {
        return Err(err("empty"));
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        "p" | "pb" | "pib" => 1 << 50,
        "s" | "sector" | "sectors" => 512,
        _ => return Err(err("unknown unit (use k, M, G, T, with or without iB)")),
    };
    if num.is_empty() {
        return Err(err("no number"));
    }
    if num.contains('.') {
        let v: f64 = num.parse().map_err(|_| err("bad number"))?;
        let bytes = v * mult as f64;
        if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
            return Err(err("out of range"));
        }
        Ok(bytes.round() as u64)
    } else {
        let v: u64 = num.parse().map_err(|_| err("bad number"))?;
        v.checked_mul(mult).ok_or_else(|| err("too large"))
    }
}

/// Formats bytes with a binary unit, e.g. `4 KiB`, `1.5 GiB`.
pub fn fmt_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else if (v - v.round()).abs() < 1e-9 {
        format!("{} {}", v.round() as u64, UNITS[u])
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// A cache size: absolute bytes or a share of the trace footprint.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CacheSize {
    Bytes(u64),
    /// Percent of the footprint (distinct lines touched), 0 < p <= 100 or more.
    Percent(f64),
}

impl CacheSize {
    /// Capacity in lines, given the line size and (for percentages) the footprint in lines.
    /// A percentage takes floor(p% x footprint), as libCacheSim does.
    pub fn lines(&self, line_size: u64, footprint_lines: u64) -> u64 {
        match *self {
            CacheSize::Bytes(b) => b / line_size,
            CacheSize::Percent(p) => (p / 100.0 * footprint_lines as f64 + 1e-9).floor() as u64,
        }
    }

    /// A share of the footprint written as a fraction (0.1 = 10 %), kept as a percentage
    /// rounded to 1e-9 % so that 0.1 prints as 10%.
    pub fn fraction(f: f64) -> CacheSize {
        CacheSize::Percent((f * 100.0 * 1e9).round() / 1e9)
    }

    pub fn needs_footprint(&self) -> bool {
        matches!(self, CacheSize::Percent(_))
    }
}

impl std::str::FromStr for CacheSize {
    type Err = SizeError;
    fn from_str(s: &str) -> Result<Self, SizeError> {
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p.trim().parse().map_err(|_| SizeError {
                input: s.to_string(),
                why: "bad percentage",
            })?;
            if !(v > 0.0 && v.is_finite()) {
                return Err(SizeError {
                    input: s.to_string(),
                    why: "percentage must be above 0",
                });
            }
            Ok(CacheSize::Percent(v))
        } else if let Some(f) = t.parse::<f64>().ok().filter(|f| *f > 0.0 && *f < 1.0) {
            // libCacheSim's way of writing a share: 0.1 is 10 % of the footprint (a cache
            // of a fraction of a byte means nothing else).
            Ok(CacheSize::fraction(f))
        } else {
            parse_size(t).map(CacheSize::Bytes)
        }
    }
}

impl fmt::Display for CacheSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheSize::Bytes(b) => write!(f, "{}", fmt_size(*b)),
            CacheSize::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl serde::Serialize for CacheSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> serde::Deserialize<'de> for CacheSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = CacheSize;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a size like \"1GiB\", a byte count, or a percentage like \"10%\"")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<CacheSize, E> {
                Ok(CacheSize::Bytes(v))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<CacheSize, E> {
                if v > 0.0 && v < 1.0 {
                    Ok(CacheSize::fraction(v))
                } else if v >= 1.0 && v.fract() == 0.0 && v < u64::MAX as f64 {
                    Ok(CacheSize::Bytes(v as u64))
                } else {
                    Err(E::custom(format!(
                        "size {v}: a fraction of the footprint below 1 (0.1 = 10%) or a whole number of bytes"
                    )))
                }
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<CacheSize, E> {
                u64::try_from(v)
                    .map(CacheSize::Bytes)
                    .map_err(|_| E::custom("negative size"))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<CacheSize, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// Serde helper for byte sizes written as strings ("64KiB") or numbers.
pub mod size_serde {
    use super::*;
    use serde::Deserialize;
    pub fn serialize<S: serde::Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&fmt_size(*v).replace(' ', ""))
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        match CacheSize::deserialize(d)? {
            CacheSize::Bytes(b) => Ok(b),
            CacheSize::Percent(_) => {
                Err(serde::de::Error::custom("a percentage is not allowed here"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("8 sectors").unwrap(), 4096);
        assert!(parse_size("4q")
            .unwrap_err()
            .to_string()
            .contains("unknown unit"));
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999999T").is_err());
        assert_eq!(fmt_size(4096), "4 KiB");
        assert_eq!(fmt_size(1536 << 20), "1.50 GiB");
    }

    #[test]
    fn cache_sizes() {
        assert_eq!(
            "10%".parse::<CacheSize>().unwrap(),
            CacheSize::Percent(10.0)
        );
        assert_eq!(
            "1GiB".parse::<CacheSize>().unwrap(),
            CacheSize::Bytes(1 << 30)
        );
        assert!("0%".parse::<CacheSize>().is_err());
        // floor(p x footprint), as libCacheSim: 1 % of 269,210 is 2,692.
        assert_eq!(CacheSize::Percent(1.0).lines(4096, 269_210), 2692);
        assert_eq!(CacheSize::Percent(10.0).lines(4096, 269_210), 26921);
        assert_eq!(CacheSize::Bytes(1 << 20).lines(4096, 0), 256);
    }
}
