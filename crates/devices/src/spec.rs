//! Device specifications: serde (TOML model files), preset names, and [`build`].
//!
//! A spec string is one of:
//! * a preset: `hdd:7200` (or bare `7200`), `hdd:5400`, `hdd:10k`, `hdd:15k`,
//!   `ssd:default` (or bare `default`), `ssd:intel-710`, `ssd:intel-311`, `ssd:c300`,
//!   `ssd:srt-3x`, `ram`, `nvram`;
//! * an array of presets: `raid0:4x7200`, `raid5:5xhdd:15k`;
//! * a path to a TOML model file (`*.toml`, or any existing file).
//!
//! A model file is a [`DeviceSpec`] table, e.g.
//!
//! ```toml
//! type = "raid"
//! level = "raid5"
//! stripe_unit_bytes = 65536
//! members = [ { type = "preset", name = "15k" }, { type = "preset", name = "15k" },
//!             { type = "hdd", rpm = 15000, seek_avg_ms = 3.3 } ]   # unset fields: hdd:7200
//! ```

use crate::{
    Checked, Device, FaultConfig, Faulty, Hdd, HddConfig, Raid, RaidConfig, RaidLevel, Ram,
    RamConfig, Ssd, SsdConfig, HDD_PRESETS, RAM_PRESETS, SSD_PRESETS,
};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// What device to build.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum DeviceSpec {
    /// Fields not given take the `hdd:7200` values.
    Hdd(HddConfig),
    /// Fields not given take the `ssd:default` values.
    Ssd(SsdConfig),
    /// Fields not given take the `ram` values.
    Ram(RamConfig),
    Raid(RaidSpec),
    Faulty(FaultySpec),
    /// A preset by name (anything [`DeviceSpec::from_str`] accepts except file paths).
    Preset {
        name: String,
    },
}

/// An array and its members.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RaidSpec {
    pub level: RaidLevel,
    #[serde(default = "default_stripe_unit")]
    pub stripe_unit_bytes: u64,
    /// The members, in order. Alternatively give `member` and `count`.
    #[serde(default)]
    pub members: Vec<DeviceSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<Box<DeviceSpec>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<usize>,
}

fn default_stripe_unit() -> u64 {
    RaidConfig::default().stripe_unit_bytes
}

/// A device with faults injected.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultySpec {
    #[serde(default)]
    pub faults: FaultConfig,
    pub inner: Box<DeviceSpec>,
}

/// Why a spec could not be parsed or built.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("unknown device preset `{name}`; known: {}", .known.join(", "))]
    UnknownPreset { name: String, known: Vec<String> },
    #[error("cannot read device file {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid device file {}: {source}", .path.display())]
    Toml {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("invalid device spec: {0}")]
    Invalid(String),
}

/// Every preset name accepted by [`DeviceSpec::from_str`], plus the array and file forms.
pub fn known_presets() -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    v.extend(HDD_PRESETS.iter().map(|p| format!("hdd:{p}")));
    v.extend(SSD_PRESETS.iter().map(|p| format!("ssd:{p}")));
    v.extend(RAM_PRESETS.iter().map(|p| p.to_string()));
    v.push("raid0:<N>x<preset>".into());
    v.push("raid5:<N>x<preset>".into());
    v.push("<path>.toml".into());
    v
}

fn unknown(name: &str) -> SpecError {
    SpecError::UnknownPreset {
        name: name.to_string(),
        known: known_presets(),
    }
}

impl DeviceSpec {
    /// A preset by name (no files). Bare names try HDD, then SSD, then RAM presets.
    pub fn preset(name: &str) -> Result<DeviceSpec, SpecError> {
        let n = name.trim().to_ascii_lowercase();
        for (prefix, level) in [("raid0:", RaidLevel::Raid0), ("raid5:", RaidLevel::Raid5)] {
            if let Some(rest) = n.strip_prefix(prefix) {
                let (count, member) = rest.split_once('x').ok_or_else(|| unknown(name))?;
                let count: usize = count.parse().map_err(|_| unknown(name))?;
                let member = DeviceSpec::preset(member).map_err(|_| unknown(name))?;
                return Ok(DeviceSpec::Raid(RaidSpec {
                    level,
                    stripe_unit_bytes: default_stripe_unit(),
                    members: vec![member; count],
                    member: None,
                    count: None,
                }));
            }
        }
        let found = if let Some(p) = n.strip_prefix("hdd:") {
            HddConfig::preset(p).map(DeviceSpec::Hdd)
        } else if let Some(p) = n.strip_prefix("ssd:") {
            SsdConfig::preset(p).map(DeviceSpec::Ssd)
        } else if let Some(p) = n.strip_prefix("ram:") {
            RamConfig::preset(p).map(DeviceSpec::Ram)
        } else {
            HddConfig::preset(&n)
                .map(DeviceSpec::Hdd)
                .or_else(|| SsdConfig::preset(&n).map(DeviceSpec::Ssd))
                .or_else(|| {
                    RAM_PRESETS
                        .contains(&n.as_str())
                        .then(|| RamConfig::preset(&n).map(DeviceSpec::Ram))
                        .flatten()
                })
        };
        found.ok_or_else(|| unknown(name))
    }

    /// Parses a TOML model file's text.
    pub fn from_toml_str(s: &str) -> Result<DeviceSpec, toml::de::Error> {
        toml::from_str(s)
    }

    pub fn load(path: &Path) -> Result<DeviceSpec, SpecError> {
        let text = std::fs::read_to_string(path).map_err(|source| SpecError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml_str(&text).map_err(|source| SpecError::Toml {
            path: path.to_path_buf(),
            source: Box::new(source),
        })
    }

    /// TOML text of this spec (a model file).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("device specs serialize to TOML")
    }
}

impl FromStr for DeviceSpec {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, SpecError> {
        let t = s.trim();
        let path = Path::new(t);
        if t.ends_with(".toml") || (t.contains(std::path::MAIN_SEPARATOR) && path.exists()) {
            return DeviceSpec::load(path);
        }
        DeviceSpec::preset(t)
    }
}

/// Builds the device a spec describes.
pub fn build(spec: &DeviceSpec) -> Result<Box<dyn Device>, SpecError> {
    let inv = SpecError::Invalid;
    Ok(match spec {
        DeviceSpec::Hdd(c) => Box::new(Checked::new(Hdd::new(c.clone()).map_err(inv)?)),
        DeviceSpec::Ssd(c) => Box::new(Checked::new(Ssd::new(c.clone()).map_err(inv)?)),
        DeviceSpec::Ram(c) => Box::new(Checked::new(Ram::new(c.clone()).map_err(inv)?)),
        DeviceSpec::Raid(r) => {
            let mut specs = r.members.clone();
            match (&r.member, r.count) {
                (Some(m), Some(n)) => specs.extend((0..n).map(|_| (**m).clone())),
                (None, None) => {}
                _ => return Err(inv("raid: give `member` and `count` together".into())),
            }
            let members = specs.iter().map(build).collect::<Result<Vec<_>, _>>()?;
            let cfg = RaidConfig {
                level: r.level,
                stripe_unit_bytes: r.stripe_unit_bytes,
            };
            Box::new(Checked::new(Raid::new(cfg, members).map_err(inv)?))
        }
        DeviceSpec::Faulty(f) => {
            let inner = build(&f.inner)?;
            Box::new(Checked::new(
                Faulty::new(inner, f.faults.clone()).map_err(inv)?,
            ))
        }
        DeviceSpec::Preset { name } => build(&DeviceSpec::preset(name)?)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preset_names() {
        for (s, want) in [
            ("hdd:7200", "hdd:7200"),
            ("7200", "hdd:7200"),
            ("15k", "hdd:15k"),
            ("HDD:10K", "hdd:10k"),
            ("ssd:default", "ssd:default"),
            ("default", "ssd:default"),
            ("intel-710", "ssd:intel-710"),
            ("ram", "ram"),
            ("nvram", "nvram"),
            ("raid0:4x7200", "raid0:4xhdd:7200"),
            ("raid5:3xhdd:15k", "raid5:3xhdd:15k"),
        ] {
            let spec: DeviceSpec = s.parse().unwrap();
            assert_eq!(build(&spec).unwrap().name(), want, "{s}");
        }
    }

    #[test]
    fn unknown_preset_lists_the_known_ones() {
        let e = "hdd:9000".parse::<DeviceSpec>().unwrap_err().to_string();
        assert!(e.contains("`hdd:9000`"), "{e}");
        for k in [
            "hdd:7200",
            "hdd:15k",
            "ssd:default",
            "ssd:intel-311",
            "ram",
            "raid5:",
        ] {
            assert!(e.contains(k), "{e} lacks {k}");
        }
        assert!("raid5:x7200".parse::<DeviceSpec>().is_err());
    }

    #[test]
    fn toml_model_files() {
        let text = r#"
            type = "raid"
            level = "raid5"
            count = 2
            member = { type = "preset", name = "15k" }
            members = [ { type = "hdd", rpm = 15000, name = "custom" } ]
        "#;
        let spec = DeviceSpec::from_toml_str(text).unwrap();
        let dev = build(&spec).unwrap();
        assert_eq!(dev.name(), "raid5:3xcustom");
        // Unset HDD fields are the 7200 preset's; capacity = 2 x the smallest member.
        assert_eq!(dev.capacity_bytes(), 2 * (500_000_000_000 / 65536 * 65536));

        for name in ["7200", "ssd:intel-311", "nvram", "raid0:2x5400"] {
            let spec = DeviceSpec::preset(name).unwrap();
            assert_eq!(
                DeviceSpec::from_toml_str(&spec.to_toml()).unwrap(),
                spec,
                "{name}"
            );
        }
        let faulty = "type = \"faulty\"\ninner = { type = \"ssd\" }\n[faults]\nseed = 3\nread_error_prob = 0.5\n";
        assert_eq!(
            build(&DeviceSpec::from_toml_str(faulty).unwrap())
                .unwrap()
                .name(),
            "faulty:ssd:default"
        );
        assert!(DeviceSpec::from_toml_str("type = \"hdd\"\nrpmm = 1").is_err());
    }

    #[test]
    fn invalid_configs_are_errors() {
        let bad = DeviceSpec::Hdd(HddConfig {
            seek_avg_ms: 30.0,
            ..HddConfig::default()
        });
        assert!(matches!(build(&bad), Err(SpecError::Invalid(_))));
        assert!("raid5:2x7200"
            .parse::<DeviceSpec>()
            .map(|s| build(&s).is_err())
            .unwrap());
        let missing = "/nonexistent/dev.toml".parse::<DeviceSpec>().unwrap_err();
        assert!(matches!(missing, SpecError::Io { .. }), "{missing}");
    }
}
