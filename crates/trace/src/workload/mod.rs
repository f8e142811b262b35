//! Seeded synthetic workloads: a spec string such as `zipf:theta=0.9,wss=4GiB,requests=1e6`
//! or `8k; 90% read; 100% random` becomes a deterministic stream of [`Request`]s.
//!
//! ```
//! use tiercache_trace::workload::WorkloadSpec;
//! let spec: WorkloadSpec = "zipf:theta=1.0,wss=64MiB,requests=1000,read=90".parse().unwrap();
//! let reqs: Vec<_> = spec.generate(42).collect();
//! assert_eq!(reqs.len(), 1000);
//! assert!(reqs.iter().all(|r| r.end() <= 64 << 20));
//! assert_eq!(spec.generate(42).collect::<Vec<_>>(), reqs); // same seed, same stream
//! ```
//!
//! See [`help`] for the syntax. Streams are reproducible across runs and platforms: every
//! random choice comes from ChaCha8 seeded from the seed, with a separate ChaCha stream for
//! offsets, operations, sizes and arrival times (so changing `read=` leaves the offsets
//! alone). Zipf and Poisson sampling use `f64` `powf`/`exp`/`ln`; a platform whose libm
//! rounds differently in the last place could, very rarely, move one sample.

pub mod bootstorm;
mod hotspot;
mod iometer;
pub mod restore;
mod seq;
mod uniform;
pub mod units;
mod zipf;

pub use units::{fmt_size_exact, parse_count, parse_percent, parse_size, SizeError};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::fmt;
use std::str::FromStr;
use tiercache_engine::{Op, Request, MAX_CLASS};

/// Default working-set size: 1 GiB.
pub const DEFAULT_WSS: u64 = 1 << 30;
/// Default number of requests.
pub const DEFAULT_REQUESTS: u64 = 1_000_000;
/// Default read share in percent. 70/30 is the classic OLTP-like mix and exercises both the
/// read and the write path of a cache.
pub const DEFAULT_READ_PCT: f64 = 70.0;
/// Default request size and alignment: 4 KiB.
pub const DEFAULT_SIZE: u64 = 4096;
/// Default alignment of offsets: 4 KiB.
pub const DEFAULT_ALIGN: u64 = 4096;
/// Default arrival rate in requests per second.
pub const DEFAULT_RATE: f64 = 1000.0;
/// Most interleaved sequential streams.
pub const MAX_STREAMS: u32 = 1 << 16;
/// Default Zipf exponent.
pub const DEFAULT_THETA: f64 = 1.0;

/// The kinds of workload, as written in a spec (aliases after the first name).
pub const KINDS: &str = "uniform, zipf, seq (sequential), hotspot, iometer (or an IOmeter access \
                         spec such as '8k; 90% read; 100% random')";

const COMMON_KEYS: &[&str] = &[
    "wss", "requests", "read", "size", "align", "rate", "arrival", "offset", "volume", "class",
];

/// A workload spec could not be parsed or is invalid.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WorkloadError {
    #[error("unknown workload kind '{kind}'; valid kinds: {KINDS}")]
    UnknownKind { kind: String },
    #[error("unknown key '{key}' for workload kind '{kind}'; valid keys: {valid}")]
    UnknownKey {
        kind: &'static str,
        key: String,
        valid: String,
    },
    #[error("bad value for {key}: {why}")]
    BadValue { key: String, why: String },
    #[error("'{part}' is not key=value{hint}")]
    Syntax { part: String, hint: &'static str },
    #[error("key '{key}' is given twice")]
    DuplicateKey { key: String },
    #[error("invalid workload: {0}")]
    Invalid(String),
}

impl WorkloadError {
    fn bad(key: &str, why: impl Into<String>) -> Self {
        WorkloadError::BadValue {
            key: key.to_string(),
            why: why.into(),
        }
    }
}

/// What decides the offsets.
#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// Uniformly random aligned offsets over the working set.
    Uniform,
    /// Zipf(theta) popularity over the working set's blocks (`align`-sized), with the
    /// popularity ranks scattered over the space by a seeded bijection.
    Zipf { theta: f64 },
    /// `streams` interleaved (round-robin) sequential streams; stream k starts k/streams of the
    /// way into the working set, runs through all of it and wraps to its start at the end.
    Sequential { streams: u32 },
    /// `seq` percent of requests start where the previous request ended (a sequential
    /// continuation, wrapping to the start at the working set's end); of the others,
    /// `hot_io` percent go to the first `hot_space` percent of the working set (of its
    /// aligned slots), uniformly, and the rest uniformly to the remainder.
    Hotspot {
        hot_io: f64,
        hot_space: f64,
        seq: f64,
    },
    /// IOmeter access spec: `random` percent of requests at uniformly random aligned offsets,
    /// the rest continue sequentially after the previous request.
    Iometer { random: f64 },
}

impl Kind {
    /// The canonical name as written in a spec.
    pub fn name(&self) -> &'static str {
        match self {
            Kind::Uniform => "uniform",
            Kind::Zipf { .. } => "zipf",
            Kind::Sequential { .. } => "seq",
            Kind::Hotspot { .. } => "hotspot",
            Kind::Iometer { .. } => "iometer",
        }
    }

    fn from_name(name: &str) -> Result<Kind, WorkloadError> {
        Ok(match name.trim().to_ascii_lowercase().as_str() {
            "uniform" | "random" => Kind::Uniform,
            "zipf" | "zipfian" => Kind::Zipf {
                theta: DEFAULT_THETA,
            },
            "seq" | "sequential" => Kind::Sequential { streams: 1 },
            "hotspot" => Kind::Hotspot {
                hot_io: 80.0,
                hot_space: 20.0,
                seq: 0.0,
            },
            "iometer" => Kind::Iometer { random: 100.0 },
            _ => {
                return Err(WorkloadError::UnknownKind {
                    kind: name.trim().to_string(),
                })
            }
        })
    }

    fn own_keys(&self) -> &'static [&'static str] {
        match self {
            Kind::Uniform => &[],
            Kind::Zipf { .. } => &["theta"],
            Kind::Sequential { .. } => &["streams"],
            Kind::Hotspot { .. } => &["hot_io", "hot_space", "seq"],
            Kind::Iometer { .. } => &["random"],
        }
    }

    fn valid_keys(&self) -> String {
        self.own_keys()
            .iter()
            .chain(COMMON_KEYS)
            .copied()
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Request sizes: one size, or several with relative weights.
#[derive(Clone, Debug, PartialEq)]
pub struct SizeDist {
    /// (size in bytes, weight); weights are relative and need not sum to 100.
    pub entries: Vec<(u64, f64)>,
}

impl SizeDist {
    pub fn fixed(size: u64) -> Self {
        SizeDist {
            entries: vec![(size, 1.0)],
        }
    }

    pub fn min(&self) -> u64 {
        self.entries.iter().map(|e| e.0).min().unwrap_or(0)
    }

    pub fn max(&self) -> u64 {
        self.entries.iter().map(|e| e.0).max().unwrap_or(0)
    }

    /// Parses `4k` or `4k@60+64k@30+1m@10`.
    pub fn parse(s: &str) -> Result<Self, WorkloadError> {
        let mut entries = Vec::new();
        for part in s.split('+') {
            let part = part.trim();
            let (size, weight) = match part.split_once('@') {
                Some((sz, w)) => {
                    let w: f64 = w.trim().parse().map_err(|_| {
                        WorkloadError::bad(
                            "size",
                            format!("weight '{w}' in '{part}' is not a number (example: size=4k@60+64k@40)"),
                        )
                    })?;
                    (sz, w)
                }
                None => (part, 1.0),
            };
            let size = parse_size(size).map_err(|e| WorkloadError::bad("size", e.to_string()))?;
            entries.push((size, weight));
        }
        let d = SizeDist { entries };
        d.validate()?;
        Ok(d)
    }

    fn validate(&self) -> Result<(), WorkloadError> {
        if self.entries.is_empty() {
            return Err(WorkloadError::bad("size", "no sizes given"));
        }
        if self.entries.len() > 1 && self.entries.iter().all(|e| e.1 == 0.0) {
            return Err(WorkloadError::bad("size", "all weights are 0"));
        }
        for &(size, w) in &self.entries {
            if size == 0 {
                return Err(WorkloadError::bad("size", "request sizes must be above 0"));
            }
            if !(w.is_finite() && w >= 0.0) {
                return Err(WorkloadError::bad(
                    "size",
                    format!("weight {w} must be a non-negative number"),
                ));
            }
        }
        Ok(())
    }
}

impl fmt::Display for SizeDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let [(size, _)] = self.entries.as_slice() {
            return f.write_str(&fmt_size_exact(*size));
        }
        for (i, (size, w)) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str("+")?;
            }
            write!(f, "{}@{w}", fmt_size_exact(*size))?;
        }
        Ok(())
    }
}

/// How arrival times are spaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Arrival {
    /// Request i arrives at i * 1e9 / rate ns.
    #[default]
    Fixed,
    /// Exponentially distributed gaps with mean 1e9 / rate ns (the first request at 0).
    Poisson,
}

impl Arrival {
    pub fn name(self) -> &'static str {
        match self {
            Arrival::Fixed => "fixed",
            Arrival::Poisson => "poisson",
        }
    }
}

/// A synthetic workload: what [`help`] describes, parsed from a spec string (`FromStr`) or a
/// TOML/JSON table (`Deserialize`: a spec string, or a table with `kind` and the keys).
///
/// Fields are public so that sweeps can vary them; [`WorkloadSpec::validate`] checks a spec
/// built by hand (parsing always validates).
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadSpec {
    pub kind: Kind,
    /// Working-set size in bytes: every request lies in `offset .. offset + wss`.
    pub wss: u64,
    /// Number of requests the generator yields.
    pub requests: u64,
    /// Share of reads in percent (the rest are writes).
    pub read_pct: f64,
    pub size: SizeDist,
    /// Offsets (relative to `offset`) are multiples of this.
    pub align: u64,
    /// Arrival rate in requests per second.
    pub rate: f64,
    pub arrival: Arrival,
    /// Base offset of the working set in bytes.
    pub offset: u64,
    pub volume: u32,
    pub class: u8,
}

impl Default for WorkloadSpec {
    fn default() -> Self {
        WorkloadSpec::new(Kind::Uniform)
    }
}

impl WorkloadSpec {
    /// A spec of this kind with every common key at its default.
    pub fn new(kind: Kind) -> Self {
        WorkloadSpec {
            kind,
            wss: DEFAULT_WSS,
            requests: DEFAULT_REQUESTS,
            read_pct: DEFAULT_READ_PCT,
            size: SizeDist::fixed(DEFAULT_SIZE),
            align: DEFAULT_ALIGN,
            rate: DEFAULT_RATE,
            arrival: Arrival::Fixed,
            offset: 0,
            volume: 0,
            class: 0,
        }
    }

    /// Checks ranges and that every request size fits in the working set.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        let pct = |key: &str, v: f64| {
            if (0.0..=100.0).contains(&v) {
                Ok(())
            } else {
                Err(WorkloadError::bad(
                    key,
                    format!("{v} is not a percentage between 0 and 100"),
                ))
            }
        };
        match self.kind {
            Kind::Uniform => {}
            Kind::Zipf { theta } => {
                if !(theta.is_finite() && (0.0..=100.0).contains(&theta)) {
                    return Err(WorkloadError::bad(
                        "theta",
                        format!("{theta} must be a number from 0 (uniform) up, e.g. 0.9 or 1.0"),
                    ));
                }
            }
            Kind::Sequential { streams } => {
                if !(1..=MAX_STREAMS).contains(&streams) {
                    return Err(WorkloadError::bad(
                        "streams",
                        format!("{streams} is not between 1 and {MAX_STREAMS}"),
                    ));
                }
            }
            Kind::Hotspot {
                hot_io,
                hot_space,
                seq,
            } => {
                pct("hot_io", hot_io)?;
                pct("seq", seq)?;
                pct("hot_space", hot_space)?;
                if hot_space == 0.0 {
                    return Err(WorkloadError::bad("hot_space", "must be above 0"));
                }
            }
            Kind::Iometer { random } => pct("random", random)?,
        }
        pct("read", self.read_pct)?;
        self.size.validate()?;
        if self.wss == 0 {
            return Err(WorkloadError::bad("wss", "must be above 0"));
        }
        if self.align == 0 {
            return Err(WorkloadError::bad("align", "must be above 0"));
        }
        if !(self.rate.is_finite() && self.rate > 0.0) {
            return Err(WorkloadError::bad("rate", "must be a number above 0"));
        }
        if self.class > MAX_CLASS {
            return Err(WorkloadError::bad(
                "class",
                format!("{} is above the largest class {MAX_CLASS}", self.class),
            ));
        }
        if self.offset.checked_add(self.wss).is_none() {
            return Err(WorkloadError::Invalid("offset + wss overflows".into()));
        }
        let max = self.size.max();
        if max > self.wss {
            return Err(WorkloadError::Invalid(format!(
                "request size {} is larger than the working set (wss={})",
                fmt_size_exact(max),
                fmt_size_exact(self.wss)
            )));
        }
        if let Kind::Sequential { streams } = self.kind {
            if u64::from(streams) > self.space().blocks(self.size.min()) {
                return Err(WorkloadError::bad(
                    "streams",
                    format!("{streams} streams do not fit in the working set's aligned slots"),
                ));
            }
        }
        Ok(())
    }

    /// An upper bound of the distinct bytes the workload touches: the working set, or less if
    /// there are too few requests to cover it.
    pub fn footprint_bytes(&self) -> u64 {
        self.wss.min(self.requests.saturating_mul(self.size.max()))
    }

    pub(crate) fn space(&self) -> Space {
        Space {
            wss: self.wss,
            align: self.align,
        }
    }

    /// The request stream for this seed. Same spec and seed, same stream.
    ///
    /// # Panics
    /// If the spec is invalid (see [`WorkloadSpec::validate`]; parsed specs are valid).
    pub fn generate(&self, seed: u64) -> Generator {
        if let Err(e) = self.validate() {
            panic!("WorkloadSpec::generate on an invalid spec: {e}");
        }
        let rng = |stream: u64| {
            let mut r = ChaCha8Rng::seed_from_u64(seed);
            r.set_stream(stream);
            r
        };
        let mut setup_rng = rng(4);
        let space = self.space();
        let min_size = self.size.min();
        let offsets = match self.kind {
            Kind::Uniform => Offsets::Uniform(uniform::Uniform::new(space)),
            Kind::Zipf { theta } => {
                Offsets::Zipf(zipf::ZipfGen::new(space, min_size, theta, &mut setup_rng))
            }
            Kind::Sequential { streams } => Offsets::Seq(seq::Seq::new(space, streams)),
            Kind::Hotspot {
                hot_io,
                hot_space,
                seq,
            } => Offsets::Hotspot(hotspot::Hotspot::new(
                space, min_size, hot_io, hot_space, seq,
            )),
            Kind::Iometer { random } => Offsets::Iometer(iometer::Iometer::new(space, random)),
        };
        let total: f64 = self.size.entries.iter().map(|e| e.1).sum();
        let mut acc = 0.0;
        let sizes: Vec<(f64, u64)> = self
            .size
            .entries
            .iter()
            .map(|&(s, w)| {
                acc += w;
                (acc / total, s)
            })
            .collect();
        Generator {
            i: 0,
            n: self.requests,
            base: self.offset,
            volume: self.volume,
            class: self.class,
            sizes,
            read_frac: self.read_pct / 100.0,
            ns_per_req: 1e9 / self.rate,
            poisson: self.arrival == Arrival::Poisson,
            t_ns: 0.0,
            offsets,
            off_rng: rng(0),
            op_rng: rng(1),
            size_rng: rng(2),
            time_rng: rng(3),
        }
    }

    /// (key, value) pairs in canonical order and form. `all` includes keys at their default.
    fn pairs(&self, all: bool) -> Vec<(&'static str, Value)> {
        let mut v = Vec::new();
        match self.kind {
            Kind::Uniform => {}
            Kind::Zipf { theta } => v.push(("theta", Value::Float(theta))),
            Kind::Sequential { streams } => v.push(("streams", Value::Int(streams.into()))),
            Kind::Hotspot {
                hot_io,
                hot_space,
                seq,
            } => {
                v.push(("hot_io", Value::Float(hot_io)));
                v.push(("hot_space", Value::Float(hot_space)));
                // Only when set, so the canonical form of a plain hotspot is unchanged.
                if all || seq != 0.0 {
                    v.push(("seq", Value::Float(seq)));
                }
            }
            Kind::Iometer { random } => v.push(("random", Value::Float(random))),
        }
        v.push(("wss", Value::Str(fmt_size_exact(self.wss))));
        v.push(("requests", Value::Int(self.requests)));
        v.push(("read", Value::Float(self.read_pct)));
        v.push(("size", Value::Str(self.size.to_string())));
        if all || self.align != DEFAULT_ALIGN {
            v.push(("align", Value::Str(fmt_size_exact(self.align))));
        }
        if all || self.rate != DEFAULT_RATE {
            v.push(("rate", Value::Float(self.rate)));
        }
        if all || self.arrival != Arrival::Fixed {
            v.push(("arrival", Value::Str(self.arrival.name().into())));
        }
        if all || self.offset != 0 {
            v.push(("offset", Value::Str(fmt_size_exact(self.offset))));
        }
        if all || self.volume != 0 {
            v.push(("volume", Value::Int(self.volume.into())));
        }
        if all || self.class != 0 {
            v.push(("class", Value::Int(self.class.into())));
        }
        v
    }

    /// Builds a spec of `kind` from `key=value` pairs (the common path of the string and the
    /// table forms).
    fn from_pairs<K: AsRef<str>, V: AsRef<str>>(
        mut kind: Kind,
        pairs: &[(K, V)],
    ) -> Result<Self, WorkloadError> {
        let mut seen: Vec<String> = Vec::new();
        let mut spec = WorkloadSpec::new(kind.clone());
        for (key, value) in pairs {
            let key = key.as_ref().trim().to_ascii_lowercase();
            let value = value.as_ref().trim();
            if seen.contains(&key) {
                return Err(WorkloadError::DuplicateKey { key });
            }
            let bad = |why: String| WorkloadError::bad(&key, why);
            let size = || parse_size(value).map_err(|e| bad(e.to_string()));
            let pct = || parse_percent(value).map_err(bad);
            match (key.as_str(), &mut kind) {
                ("theta", Kind::Zipf { theta }) => {
                    *theta = value.parse().map_err(|_| {
                        bad(format!(
                            "'{value}' is not a number (examples: theta=0.9, theta=1.0)"
                        ))
                    })?
                }
                ("streams", Kind::Sequential { streams }) => {
                    *streams = value.parse().map_err(|_| {
                        bad(format!(
                            "'{value}' is not a whole number (example: streams=4)"
                        ))
                    })?
                }
                ("hot_io", Kind::Hotspot { hot_io, .. }) => *hot_io = pct()?,
                ("hot_space", Kind::Hotspot { hot_space, .. }) => *hot_space = pct()?,
                ("seq", Kind::Hotspot { seq, .. }) => *seq = pct()?,
                ("random", Kind::Iometer { random }) => *random = pct()?,
                ("wss", _) => spec.wss = size()?,
                ("requests", _) => spec.requests = parse_count(value).map_err(bad)?,
                ("read", _) => spec.read_pct = pct()?,
                ("size", _) => spec.size = SizeDist::parse(value)?,
                ("align", _) => spec.align = size()?,
                ("offset", _) => spec.offset = size()?,
                ("rate", _) => {
                    spec.rate = units::parse_positive(value)
                        .map_err(|e| bad(format!("{e} (requests per second, e.g. rate=1000)")))?
                }
                ("arrival", _) => {
                    spec.arrival = match value.to_ascii_lowercase().as_str() {
                        "fixed" | "constant" | "uniform" => Arrival::Fixed,
                        "poisson" | "exp" | "exponential" => Arrival::Poisson,
                        _ => return Err(bad(format!("'{value}'; valid values: fixed, poisson"))),
                    }
                }
                ("volume", _) => {
                    spec.volume = value.parse().map_err(|_| {
                        bad(format!(
                            "'{value}' is not a volume number (0 to 4294967295)"
                        ))
                    })?
                }
                ("class", _) => {
                    spec.class =
                        value
                            .parse()
                            .ok()
                            .filter(|c| *c <= MAX_CLASS)
                            .ok_or_else(|| {
                                bad(format!(
                                    "'{value}' is not a class number (0 to {MAX_CLASS})"
                                ))
                            })?
                }
                _ => {
                    return Err(WorkloadError::UnknownKey {
                        kind: kind.name(),
                        key: key.to_string(),
                        valid: kind.valid_keys(),
                    })
                }
            }
            seen.push(key);
        }
        spec.kind = kind;
        spec.validate()?;
        Ok(spec)
    }
}

impl FromStr for WorkloadSpec {
    type Err = WorkloadError;

    fn from_str(s: &str) -> Result<Self, WorkloadError> {
        let s = s.trim();
        if s.contains(';') {
            return iometer::parse_access_spec(s);
        }
        let (kind, rest) = s.split_once(':').unwrap_or((s, ""));
        let kind = Kind::from_name(kind)?;
        let mut pairs = Vec::new();
        for part in rest.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| WorkloadError::Syntax {
                part: part.to_string(),
                hint: " (a spec is KIND:key=value,key=value..., e.g. zipf:theta=0.9,wss=4GiB)",
            })?;
            pairs.push((k, v));
        }
        WorkloadSpec::from_pairs(kind, &pairs)
    }
}

/// The canonical spec string: kind, its own keys, `wss`, `requests`, `read`, `size`, then the
/// other common keys that differ from their defaults. It parses back to an equal spec.
impl fmt::Display for WorkloadSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.name())?;
        for (i, (k, v)) in self.pairs(false).into_iter().enumerate() {
            write!(f, "{}{k}={v}", if i == 0 { ':' } else { ',' })?;
        }
        Ok(())
    }
}

/// A value in the canonical form of a spec.
enum Value {
    Str(String),
    Int(u64),
    Float(f64),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Str(s) => f.write_str(s),
            Value::Int(i) => write!(f, "{i}"),
            Value::Float(x) => write!(f, "{x}"),
        }
    }
}

/// Serialized as a table: `kind` plus every key (sizes as strings like `"1GiB"`).
impl serde::Serialize for WorkloadSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let pairs = self.pairs(true);
        let mut m = s.serialize_map(Some(pairs.len() + 1))?;
        m.serialize_entry("kind", self.kind.name())?;
        for (k, v) in pairs {
            match v {
                Value::Str(x) => m.serialize_entry(k, &x)?,
                Value::Int(x) => m.serialize_entry(k, &x)?,
                Value::Float(x) => m.serialize_entry(k, &x)?,
            }
        }
        m.end()
    }
}

/// Deserialized from a spec string, or from a table with `kind` and any keys of the spec
/// syntax (values may be strings or numbers: `wss = "4GiB"`, `requests = 1000000`).
impl<'de> serde::Deserialize<'de> for WorkloadSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = WorkloadSpec;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a workload spec string like \"zipf:theta=0.9,wss=4GiB\" or a table with \
                     `kind` and keys",
                )
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<WorkloadSpec, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<WorkloadSpec, A::Error> {
                use serde::de::Error;
                let mut kind = None;
                let mut pairs: Vec<(String, String)> = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    let Scalar(value) = map.next_value()?;
                    if key == "kind" {
                        kind = Some(Kind::from_name(&value).map_err(A::Error::custom)?);
                    } else {
                        pairs.push((key, value));
                    }
                }
                let kind = kind.ok_or_else(|| {
                    A::Error::custom(format!("workload table needs `kind` (one of: {KINDS})"))
                })?;
                WorkloadSpec::from_pairs(kind, &pairs).map_err(A::Error::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// A string, number or boolean table value, as its text.
struct Scalar(String);

impl<'de> serde::Deserialize<'de> for Scalar {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a number")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// Offsets relative to the working set's base, for requests of a given length.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Space {
    pub wss: u64,
    pub align: u64,
}

impl Space {
    /// The highest aligned slot where a request of `len` bytes (`len <= wss`) still fits.
    #[inline]
    pub fn max_slot(&self, len: u64) -> u64 {
        if self.align.is_power_of_two() {
            // A shift instead of a division in the hot path.
            (self.wss - len) >> self.align.trailing_zeros()
        } else {
            (self.wss - len) / self.align
        }
    }

    /// Number of aligned slots where a request of `len` bytes fits: the workload's "blocks".
    #[inline]
    pub fn blocks(&self, len: u64) -> u64 {
        self.max_slot(len) + 1
    }

    /// Byte offset of `slot`, moved down to the last slot where `len` bytes fit.
    #[inline]
    pub fn offset(&self, slot: u64, len: u64) -> u64 {
        slot.min(self.max_slot(len)) * self.align
    }

    /// `pos` rounded up to the alignment.
    #[inline]
    pub fn round_up(&self, pos: u64) -> u64 {
        pos.div_ceil(self.align) * self.align
    }
}

#[derive(Clone, Debug)]
enum Offsets {
    Uniform(uniform::Uniform),
    Zipf(zipf::ZipfGen),
    Seq(seq::Seq),
    Hotspot(hotspot::Hotspot),
    Iometer(iometer::Iometer),
}

/// The request stream of a [`WorkloadSpec`] for one seed; yields exactly `requests` items.
#[derive(Clone, Debug)]
pub struct Generator {
    i: u64,
    n: u64,
    base: u64,
    volume: u32,
    class: u8,
    /// (cumulative probability, size)
    sizes: Vec<(f64, u64)>,
    read_frac: f64,
    ns_per_req: f64,
    poisson: bool,
    t_ns: f64,
    offsets: Offsets,
    off_rng: ChaCha8Rng,
    op_rng: ChaCha8Rng,
    size_rng: ChaCha8Rng,
    time_rng: ChaCha8Rng,
}

impl Generator {
    #[inline]
    fn next_size(&mut self) -> u64 {
        if let [(_, s)] = self.sizes.as_slice() {
            return *s;
        }
        let u: f64 = self.size_rng.gen();
        for &(c, s) in &self.sizes {
            if u < c {
                return s;
            }
        }
        self.sizes[self.sizes.len() - 1].1
    }

    #[inline]
    fn next_op(&mut self) -> Op {
        if self.read_frac >= 1.0 {
            Op::Read
        } else if self.read_frac <= 0.0 {
            Op::Write
        } else if self.op_rng.gen::<f64>() < self.read_frac {
            Op::Read
        } else {
            Op::Write
        }
    }

    #[inline]
    fn next_time(&mut self) -> u64 {
        if self.poisson {
            let t = self.t_ns;
            let u: f64 = self.time_rng.gen(); // [0, 1)
            self.t_ns += -(1.0 - u).ln() * self.ns_per_req;
            round(t)
        } else {
            round(self.i as f64 * self.ns_per_req)
        }
    }
}

/// Rounds a non-negative time to whole ns; `f64::round` is a libm call on baseline x86-64.
#[inline]
fn round(t: f64) -> u64 {
    (t + 0.5) as u64
}

impl Iterator for Generator {
    type Item = Request;

    #[inline]
    fn next(&mut self) -> Option<Request> {
        if self.i >= self.n {
            return None;
        }
        let len = self.next_size();
        let op = self.next_op();
        let time_ns = self.next_time();
        let rng = &mut self.off_rng;
        let rel = match &mut self.offsets {
            Offsets::Uniform(g) => g.next(len, rng),
            Offsets::Zipf(g) => g.next(len, rng),
            Offsets::Seq(g) => g.next(len),
            Offsets::Hotspot(g) => g.next(len, rng),
            Offsets::Iometer(g) => g.next(len, rng),
        };
        self.i += 1;
        Some(Request {
            time_ns,
            op,
            offset: self.base + rel,
            len,
            class: self.class,
            volume: self.volume,
            fua: false,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.n - self.i;
        match usize::try_from(left) {
            Ok(l) => (l, Some(l)),
            Err(_) => (usize::MAX, None),
        }
    }
}

/// `len()` is the number of requests still to come (`requests` for a fresh generator).
impl ExactSizeIterator for Generator {}

impl std::iter::FusedIterator for Generator {}

/// The workload spec syntax, with examples (for `--help`).
pub fn help() -> &'static str {
    "\
WORKLOAD SPECS
  KIND[:key=value,key=value...]   or an IOmeter access spec   SIZE; R% read; X% random[; align A]

Kinds:
  uniform            uniformly random offsets over the working set
  zipf               Zipf popularity over the working set's align-sized blocks; the popular
                     blocks are scattered over the space. theta=T (default 1.0; 0 = uniform)
  seq | sequential   sequential runs through the working set, wrapping at its end.
                     streams=N interleaved streams, each starting at its own 1/N (default 1)
  hotspot            hot_io=X percent of the I/O goes to the first hot_space=Y percent of the
                     working set (defaults 80 and 20), uniformly within each part;
                     seq=S percent of the requests instead start where the previous one
                     ended (default 0), the rest are placed as above
  iometer            random=X percent of requests at random aligned offsets, the rest continue
                     where the previous request ended (default 100)

Keys for every kind (defaults in brackets):
  wss=SIZE        working-set size [1GiB]; requests stay in offset .. offset+wss
  requests=N      number of requests [1000000]; 1e6 and 1_000_000 work too
  read=PCT        share of reads in percent, the rest are writes [70]
  size=SIZE       request size [4k], or weighted sizes: size=4k@60+64k@30+1m@10
  align=SIZE      offsets are multiples of it (relative to offset) [4k]
  rate=IOPS       arrival rate; request i arrives at i*1e9/rate ns [1000]
  arrival=KIND    fixed [default] or poisson (exponential gaps, mean 1e9/rate ns)
  offset=SIZE     base offset of the working set [0]
  volume=N        volume id [0];   class=N   I/O class 0..31 [0]

SIZE: 4096, 4k, 4KiB, 64k, 1m, 1MiB, 1g, 1GiB, 1.5GiB (k = KiB = 1024). PCT: 70 or 70%.
The same spec and seed always give the same requests.

Examples:
  zipf:theta=0.9,wss=4GiB,requests=1e7,read=80
  uniform:wss=64GiB,size=4k@70+64k@30,read=50,rate=20000,arrival=poisson
  seq:streams=4,wss=10GiB,size=128k,read=100
  hotspot:hot_io=90,hot_space=10,wss=100GiB
  8k; 90% read; 100% random
  4k;100%read;0%random
  64k; 30% read; 50% random; align 64k; wss=8GiB; requests=2e6
"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_round_trips() {
        for s in [
            "uniform",
            "zipf:theta=0.9,wss=4GiB,requests=1e7,read=80",
            "uniform:wss=64GiB,size=4k@70+64k@30,read=50,rate=20000,arrival=poisson",
            "seq:streams=4,wss=10GiB,size=128k,read=100,offset=1GiB,volume=3,class=7",
            "hotspot:hot_io=90,hot_space=10,wss=100GiB,align=512,size=512",
            "hotspot:hot_io=85,hot_space=5,seq=42,wss=8GiB,size=4k@28+128k@72",
            "8k; 90% read; 100% random",
            "64k; 30% read; 50% random; align 64k; wss=8GiB; requests=2e6",
            "zipf:wss=1.5GiB,rate=2.5",
        ] {
            let a: WorkloadSpec = s.parse().unwrap();
            let text = a.to_string();
            let b: WorkloadSpec = text.parse().unwrap();
            assert_eq!(a, b, "{s} -> {text}");
            assert_eq!(text, b.to_string());
        }
        assert_eq!(
            "zipf".parse::<WorkloadSpec>().unwrap().to_string(),
            "zipf:theta=1,wss=1GiB,requests=1000000,read=70,size=4KiB"
        );
    }

    #[test]
    fn table_form_uses_the_same_keys() {
        use serde::de::value::{Error, MapDeserializer, StrDeserializer};
        use serde::Deserialize;
        let map = MapDeserializer::<_, Error>::new(
            [
                ("kind", "hotspot"),
                ("hot_io", "90"),
                ("wss", "64MiB"),
                ("requests", "5000"),
            ]
            .into_iter(),
        );
        let spec = WorkloadSpec::deserialize(map).unwrap();
        assert_eq!(
            spec,
            "hotspot:hot_io=90,wss=64MiB,requests=5000".parse().unwrap()
        );
        let s = WorkloadSpec::deserialize(StrDeserializer::<Error>::new("seq:streams=2")).unwrap();
        assert_eq!(s.kind, Kind::Sequential { streams: 2 });
        let bad = MapDeserializer::<_, Error>::new([("kind", "zipf"), ("thta", "1")].into_iter());
        let e = WorkloadSpec::deserialize(bad).unwrap_err().to_string();
        assert!(e.contains("thta") && e.contains("theta"), "{e}");
        let nokind = MapDeserializer::<_, Error>::new([("wss", "1g")].into_iter());
        assert!(WorkloadSpec::deserialize(nokind)
            .unwrap_err()
            .to_string()
            .contains("kind"));
    }

    #[test]
    fn full_pairs_parse_back() {
        let spec: WorkloadSpec = "8k; 90% read; 25% random; offset=1m; class=3"
            .parse()
            .unwrap();
        let pairs: Vec<(String, String)> = spec
            .pairs(true)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(
            WorkloadSpec::from_pairs(Kind::from_name("iometer").unwrap(), &pairs).unwrap(),
            spec
        );
    }

    #[test]
    fn len_counts_down() {
        let spec: WorkloadSpec = "uniform:requests=10,wss=1m".parse().unwrap();
        let mut g = spec.generate(1);
        assert_eq!(g.len(), 10);
        g.next();
        assert_eq!(g.len(), 9);
        assert_eq!(g.count(), 9);
    }
}
