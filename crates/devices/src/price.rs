//! Device prices, to put a cost on a configuration. Defaults are DEVICES.md section 4, with
//! the source key and the date context of each price; prices from different years are not
//! comparable with each other.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One price point.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Price {
    /// A device of `capacity_gb` (10^9 bytes) for `usd`.
    Device { usd: f64, capacity_gb: f64 },
    /// A price per GB (10^9 bytes).
    PerGb { usd_per_gb: f64 },
}

impl Price {
    pub fn usd_per_gb(&self) -> f64 {
        match *self {
            Price::Device { usd, capacity_gb } => usd / capacity_gb,
            Price::PerGb { usd_per_gb } => usd_per_gb,
        }
    }
}

/// A priced device and where the figure comes from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceEntry {
    /// What was priced (the real product, which may be a proxy for the preset).
    pub device: String,
    pub price: Price,
    /// DEVICES.md reference key(s) and date context.
    pub source: String,
}

/// Prices keyed by device preset name (`hdd:7200`, `ssd:default`, ...) or any name a
/// config uses. Loadable from TOML (`[entries."hdd:7200"] ...`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PriceTable {
    pub entries: BTreeMap<String, PriceEntry>,
}

impl Default for PriceTable {
    fn default() -> Self {
        let mut t = PriceTable {
            entries: BTreeMap::new(),
        };
        let mut add = |k: &str, device: &str, price: Price, source: &str| {
            t.entries.insert(
                k.to_string(),
                PriceEntry {
                    device: device.into(),
                    price,
                    source: source.into(),
                },
            );
        };
        let dev = |usd, capacity_gb| Price::Device { usd, capacity_gb };
        add(
            "hdd:7200",
            "Hitachi Deskstar 7K1000 1 TB (7200 rpm class proxy)",
            dev(399.0, 1000.0),
            "[DT7K] suggested price at launch, Q1 2007",
        );
        add(
            "hdd:7200-nearline-2013",
            "4 TB nearline (WD RE / Constellation)",
            dev(400.0, 4000.0),
            "[NWC13] '< $400', ~2013 (upper bound)",
        );
        add(
            "hdd:10k",
            "WD VelociRaptor 1 TB (proxy for the 600 GB preset)",
            dev(320.0, 1000.0),
            "[TRVR] asking price, 2012",
        );
        // Not in DEVICES.md (its 15K row has "?"): NewEgg bare-drive prices of 2010-10-18 as
        // listed at http://www.qdpma.com/storage/HDD.html (Cheetah 15K.7 300 GB $270, 450 GB
        // $410, 600 GB $510; the same list has a Constellation 7200 rpm 1 TB at $150). The
        // preset is the 600 GB ST3600057SS.
        add(
            "hdd:15k",
            "Seagate Cheetah 15K.7 600 GB (ST3600057SS)",
            dev(510.0, 600.0),
            "[QDPMA] NewEgg price 2010-10-18, http://www.qdpma.com/storage/HDD.html",
        );
        add(
            "ssd:default",
            "Samsung 830 256 GB (SATA-class proxy)",
            dev(300.0, 256.0),
            "[TRVR] ~street price, 2012 (date inferred)",
        );
        add(
            "ssd:intel-710",
            "Intel SSD 710 200 GB",
            dev(1299.0, 200.0),
            "[TH710] debut price ($6.50/GB), 2011",
        );
        add(
            "ssd:intel-311",
            "Intel SSD 311 20 GB",
            dev(110.0, 20.0),
            "[AT311] expected retail, May 2011 ($100 [TH311])",
        );
        add(
            "ssd:dc-s3500",
            "Intel DC S3500",
            Price::PerGb { usd_per_gb: 1.30 },
            "[NWC13] ~$1.30/GB, ~2013",
        );
        add(
            "ssd:nvme-970-evo",
            "Samsung 970 EVO 1 TB (NVMe TLC)",
            dev(449.99, 1000.0),
            "[TG970] MSRP, 2018",
        );
        // No sourced price: hdd:5400 (DEVICES.md has ?), ram, nvram.
        t
    }
}

impl PriceTable {
    pub fn get(&self, name: &str) -> Option<&PriceEntry> {
        self.entries.get(name)
    }

    pub fn usd_per_gb(&self, name: &str) -> Option<f64> {
        self.get(name).map(|e| e.price.usd_per_gb())
    }

    /// Cost of `capacity_bytes` of `name` at its per-GB price.
    pub fn cost_usd(&self, name: &str, capacity_bytes: u64) -> Option<f64> {
        self.usd_per_gb(name)
            .map(|p| p * capacity_bytes as f64 / 1e9)
    }

    /// Cost of whole devices: `count` x the listed device price (`Price::Device`), or
    /// `capacity_bytes` at the per-GB price.
    pub fn devices_usd(&self, name: &str, count: u32, capacity_bytes: u64) -> Option<f64> {
        self.get(name).map(|e| match e.price {
            Price::Device { usd, .. } => usd * count as f64,
            Price::PerGb { usd_per_gb } => usd_per_gb * capacity_bytes as f64 / 1e9 * count as f64,
        })
    }
}

/// Dollars per (MB of capacity x IOPS delivered), the DSS figure of merit: lower is better.
pub fn usd_per_mb_per_iops(usd: f64, capacity_bytes: u64, iops: f64) -> f64 {
    usd / (capacity_bytes as f64 / 1e6) / iops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_toml_round_trip() {
        let t = PriceTable::default();
        assert!((t.usd_per_gb("ssd:intel-710").unwrap() - 6.495).abs() < 1e-9);
        assert!((t.cost_usd("hdd:7200", 500_000_000_000).unwrap() - 199.5).abs() < 1e-9);
        assert_eq!(t.devices_usd("hdd:10k", 4, 0), Some(1280.0));
        assert!((t.usd_per_gb("hdd:15k").unwrap() - 0.85).abs() < 1e-9);
        assert_eq!(t.devices_usd("hdd:15k", 5, 0), Some(2550.0));
        assert_eq!(t.usd_per_gb("hdd:5400"), None);
        let s = toml::to_string(&t).unwrap();
        let back: PriceTable = toml::from_str(&s).unwrap();
        assert_eq!(back, t);
        assert!(usd_per_mb_per_iops(100.0, 1_000_000, 50.0) - 2.0 < 1e-12);
    }
}
