//! The trace formats: one file each, declaring a [`Spec`] (name, capabilities, detection,
//! parser, writer), and one line each in the [`registry!`] below.
//!
//! Text parsers get one line as bytes (without the line end) and split it into at most
//! [`MAX_FIELDS`] borrowed slices on the stack: no allocation per record, no `String` per
//! field. Numbers are parsed from the bytes directly; decimal seconds are converted to
//! nanoseconds exactly (no float rounding). Errors name the column: `column 4 (Size): 'abc'
//! is not a whole number`; the reader adds the file and line.
//!
//! | name | fields and units | volume | class |
//! |---|---|---|---|
//! | `msr` | FILETIME (100 ns), host, disk, Read/Write, offset B, size B, response | DiskNumber | 0 |
//! | `systor` | header; epoch s (decimal), response, R/W, LUN, offset B, size B | LUN | 0 |
//! | `tencent` | Unix s, offset sectors, size sectors, 0 read / 1 write, volume id | VolumeID | 0 |
//! | `alibaba` | device, R/W, offset B, length B, timestamp us | device_id | 0 |
//! | `spc` | ASU, LBA sectors, size B, r/w, timestamp s (decimal), extra columns ignored | ASU | 0 |
//! | `disksim` | arrival **ns** (MQSim), device, start sector, sectors, 1 read / 0 write | device | 0 |
//! | `arc` | start block, blocks, ignored, request number; reads; 512 B blocks by default | 0 | 0 |
//! | `blkparse` | `maj,min cpu seq time_s pid action RWBS sector + count [proc]` | `maj << 20 \| min` | 0 |
//! | `lcs-csv` | header; version, time s, SCSI opcode hex, size B, lbn sectors | 0 | 0 |
//! | `oracle-general` | 24 B LE `<u32 time_s, u64 obj_id, u32 size, i64 next>`; reads; id x 512 B | 0 | 0 |
//! | `vscsi` | 32 B (v1) or 40 B (v2) LE records; SCSI opcode, lbn sectors, ts us | 0 | 0 |
//! | `simple` | header; `time_ns,op,offset,len[,class[,volume[,fua]]]` | column | column |
//! | `fiu` | `ts_ns pid process lba size op major minor md5` (sectors; md5 kept by [`fiu::read`]) | `major << 20 \| minor` | 0 |
//!
//! Sectors are 512 bytes everywhere. Times become nanoseconds since the first record (see
//! [`crate::TraceReader`]).

pub mod alibaba;
pub mod arc;
pub mod blkparse;
pub mod disksim;
pub mod fiu;
pub mod lcs_csv;
pub mod lcs_txt;
pub mod msr;
pub mod oracle;
pub mod simple;
pub mod spc;
pub mod systor;
pub mod tencent;
pub mod vscsi;

use std::fmt;
use std::io;
use std::str::FromStr;
use tiercache_engine::Request;

/// Parses one record (a text line without its end, or one binary record): `None` for a
/// record that is no request (a comment, another blkparse action). No allocation on success.
pub type ParseFn = fn(&[u8], &Ctx) -> Result<Option<Request>, String>;
/// Writes one request; `seq` counts requests written, from 1.
pub type WriteFn =
    fn(&mut WriteState, &mut dyn io::Write, &Request, &Ctx, u64) -> io::Result<Written>;
/// A binary format's record size from its first record, or why it is not this format.
pub type RecordSizeFn = fn(&[u8]) -> Result<usize, String>;
/// Writes what a format held back until the end (oracleGeneral's next-access indices).
pub type FinishFn = fn(&mut WriteState, &mut dyn io::Write) -> io::Result<()>;

/// Everything the reader, the writer, detection and `tiercache trace formats` know about a
/// format: each format's file declares one, and [`registry!`] lists them.
pub struct Spec {
    /// The `--format` name.
    pub name: &'static str,
    /// Other names `--format` accepts.
    pub aliases: &'static [&'static str],
    /// One line for `tiercache trace formats`.
    pub description: &'static str,
    /// Whether records say read or write (false: every request read back is a read).
    pub has_op: bool,
    /// Fixed record size of a binary format; 0 for a text format (one record per line).
    pub record_size: usize,
    /// Binary formats whose record size the first record decides (vscsi v1/v2): its size
    /// from the first `record_size` bytes, or why it is not this format.
    pub first_record: Option<RecordSizeFn>,
    /// The header line the writer puts first.
    pub header: Option<&'static str>,
    /// A first line starting with this decides detection (the header, or its stable start).
    pub detect_header: Option<&'static str>,
    /// File-name fragments (lower case) that suggest the format: they break ties.
    pub name_hints: &'static [&'static str],
    /// Text: whether one record line fits. Binary: whether the first bytes look like it.
    pub fits: fn(&[u8]) -> bool,
    /// Text: a first line that fits this format alone decides detection (blkparse).
    pub decides_alone: bool,
    /// When the records fit no format, a unique file-name hint for this one decides.
    pub trust_name: bool,
    pub parse: ParseFn,
    /// `None`: the format cannot be written.
    pub write: Option<WriteFn>,
    pub finish: Option<FinishFn>,
}

impl Spec {
    pub fn is_binary(&self) -> bool {
        self.record_size != 0
    }
}

/// A trace format: a registered [`Spec`], named by its `--format` name (so that formats
/// compare, hash and match as plain values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Format(&'static str);

/// The format registry: one line per format, `Constant = module`, in the order
/// `tiercache trace formats` lists them. A new format is a file with a `SPEC` and a line
/// here; the conformance test (tests/conformance.rs) then runs it.
macro_rules! registry {
    ($($konst:ident = $module:ident),* $(,)?) => {
        #[allow(non_upper_case_globals)]
        impl Format {
            $(pub const $konst: Format = Format($module::SPEC.name);)*
            /// Every registered format.
            pub const ALL: [Format; [$(stringify!($konst)),*].len()] = [$(Format::$konst),*];
        }
        /// Every registered format's spec, in [`Format::ALL`]'s order.
        pub static REGISTRY: [&Spec; [$(stringify!($konst)),*].len()] = [$(&$module::SPEC),*];
    };
}

registry! {
    Simple = simple,
    Msr = msr,
    Systor = systor,
    Tencent = tencent,
    Alibaba = alibaba,
    Spc = spc,
    Disksim = disksim,
    Arc = arc,
    Blkparse = blkparse,
    LcsCsv = lcs_csv,
    LcsTxt = lcs_txt,
    OracleGeneral = oracle,
    Vscsi = vscsi,
    Fiu = fiu,
}

impl Format {
    /// This format's spec (a short search of the registry: look it up once per trace, not
    /// per record).
    pub fn spec(self) -> &'static Spec {
        REGISTRY
            .iter()
            .find(|s| s.name == self.0)
            .expect("a Format is made only from a registered spec")
    }

    pub fn name(self) -> &'static str {
        self.0
    }

    pub fn description(self) -> &'static str {
        self.spec().description
    }

    /// Whether records say read or write: ARC, lcs-txt and oracleGeneral list accesses only,
    /// and every request read back from them is a read.
    pub fn has_op(self) -> bool {
        self.spec().has_op
    }

    /// Whether records are fixed-size binary.
    pub fn is_binary(self) -> bool {
        self.spec().is_binary()
    }

    /// Whether requests can be written in this format.
    pub fn is_writable(self) -> bool {
        self.spec().write.is_some()
    }

    /// Record size of binary formats (vscsi: version 1; version 2 records are 40 bytes).
    pub fn record_size(self) -> usize {
        self.spec().record_size
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase().replace('_', "-");
        REGISTRY
            .iter()
            .find(|f| f.name == t || f.aliases.contains(&t.as_str()))
            .map(|f| Format(f.name))
            .ok_or_else(|| {
                format!(
                    "unknown trace format '{s}'; known: {} (or auto)",
                    Format::ALL.map(|f| f.name()).join(", ")
                )
            })
    }
}

/// Largest binary record of any format (the reader's record buffer).
pub const MAX_RECORD: usize = 64;

/// What a writer keeps between records (oracleGeneral writes everything at the end).
#[derive(Default)]
pub struct WriteState {
    pub(crate) oracle: oracle::Pending,
}

/// Detection helpers: a line's comma-separated fields (trimmed) and whitespace-separated
/// fields. They allocate; detection reads 32 lines, not the trace.
pub(crate) fn csv_fields(line: &[u8]) -> Vec<&[u8]> {
    line.split(|&b| b == b',').map(|p| p.trim_ascii()).collect()
}

pub(crate) fn ws_fields(line: &[u8]) -> Vec<&[u8]> {
    line.split(|b| b.is_ascii_whitespace())
        .filter(|p| !p.is_empty())
        .collect()
}

pub(crate) fn is_int(b: &[u8]) -> bool {
    parse_u64(b).is_some()
}

pub(crate) fn is_dec(b: &[u8]) -> bool {
    parse_scaled(b, 0).is_some()
}

pub(crate) fn is_rw(b: &[u8]) -> bool {
    matches!(b, b"R" | b"W" | b"r" | b"w")
}

/// State a parser or writer may need.
#[derive(Clone, Debug)]
pub struct Ctx {
    /// Bytes per block (ARC, oracleGeneral).
    pub block_size: u64,
    pub blkparse_action: u8,
}

impl Default for Ctx {
    fn default() -> Self {
        Ctx {
            block_size: 512,
            blkparse_action: b'Q',
        }
    }
}

/// What a writer does with a request its format cannot represent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    Yes,
    /// Not written: the format has no such operation (e.g. a trim in an MSR trace).
    Dropped,
}

/// Most fields a text record is split into; further fields are counted but not kept.
pub const MAX_FIELDS: usize = 12;

/// A text line's fields as borrowed byte slices (on the stack), with parsers that name the
/// column on error.
pub(crate) struct Fields<'a> {
    parts: [&'a [u8]; MAX_FIELDS],
    kept: usize,
    total: usize,
    names: &'static [&'static str],
}

impl<'a> Fields<'a> {
    /// Comma-separated; each field trimmed of ASCII whitespace.
    #[inline]
    pub fn csv(line: &'a [u8], names: &'static [&'static str]) -> Self {
        let mut f = Fields {
            parts: [&[]; MAX_FIELDS],
            kept: 0,
            total: 0,
            names,
        };
        for p in line.split(|&b| b == b',') {
            f.push(p.trim_ascii());
        }
        f
    }

    /// Separated by runs of ASCII whitespace.
    #[inline]
    pub fn ws(line: &'a [u8], names: &'static [&'static str]) -> Self {
        let mut f = Fields {
            parts: [&[]; MAX_FIELDS],
            kept: 0,
            total: 0,
            names,
        };
        for p in line.split(|b| b.is_ascii_whitespace()) {
            if !p.is_empty() {
                f.push(p);
            }
        }
        f
    }

    #[inline]
    fn push(&mut self, p: &'a [u8]) {
        if self.kept < MAX_FIELDS {
            self.parts[self.kept] = p;
            self.kept += 1;
        }
        self.total += 1;
    }

    /// Number of fields in the line.
    pub fn len(&self) -> usize {
        self.total
    }

    pub fn need(&self, n: usize) -> Result<(), String> {
        if self.total < n {
            Err(format!(
                "expected at least {n} fields ({}), found {}",
                self.names[..n.min(self.names.len())].join(","),
                self.total
            ))
        } else {
            Ok(())
        }
    }

    fn name(&self, i: usize) -> String {
        match self.names.get(i) {
            Some(n) => format!("column {} ({n})", i + 1),
            None => format!("column {}", i + 1),
        }
    }

    /// An error about column `i`: `column 4 (Size): 'abc' <what>`.
    #[cold]
    pub fn err(&self, i: usize, what: &str) -> String {
        let v = self.parts.get(i).copied().unwrap_or_default();
        format!(
            "{}: '{}' {what}",
            self.name(i),
            String::from_utf8_lossy(&v[..v.len().min(64)])
        )
    }

    #[inline]
    pub fn bytes(&self, i: usize) -> Result<&'a [u8], String> {
        if i < self.kept {
            Ok(self.parts[i])
        } else {
            Err(format!("{} is missing", self.name(i)))
        }
    }

    /// Whether column `i` exists and is not empty.
    pub fn has(&self, i: usize) -> bool {
        i < self.kept && !self.parts[i].is_empty()
    }

    #[inline]
    pub fn u64(&self, i: usize) -> Result<u64, String> {
        parse_u64(self.bytes(i)?).ok_or_else(|| self.err(i, "is not a whole number"))
    }

    #[inline]
    pub fn u32(&self, i: usize) -> Result<u32, String> {
        let v = self.u64(i)?;
        u32::try_from(v).map_err(|_| self.err(i, "is too large (above 4294967295)"))
    }

    /// A hexadecimal number, with or without `0x`.
    pub fn hex(&self, i: usize) -> Result<u64, String> {
        let b = self.bytes(i)?;
        let b = b
            .strip_prefix(b"0x")
            .or_else(|| b.strip_prefix(b"0X"))
            .unwrap_or(b);
        parse_hex(b).ok_or_else(|| self.err(i, "is not a hex number"))
    }

    /// A non-negative decimal number scaled by 10^`pow10` and truncated to an integer:
    /// seconds with `pow10` = 9 give nanoseconds (exactly, for up to 9 decimals).
    #[inline]
    pub fn scaled(&self, i: usize, pow10: u32) -> Result<u64, String> {
        parse_scaled(self.bytes(i)?, pow10)
            .ok_or_else(|| self.err(i, "is not a non-negative number (or is out of range)"))
    }
}

/// A decimal unsigned integer (digits only, checked for overflow).
#[inline]
pub fn parse_u64(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 20 {
        return None;
    }
    let mut v: u64 = 0;
    if b.len() < 20 {
        for &c in b {
            let d = c.wrapping_sub(b'0');
            if d > 9 {
                return None;
            }
            v = v * 10 + d as u64;
        }
        return Some(v);
    }
    for &c in b {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(d as u64)?;
    }
    Some(v)
}

fn parse_hex(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 16 {
        return None;
    }
    let mut v = 0u64;
    for &c in b {
        let d = (c as char).to_digit(16)?;
        v = v << 4 | d as u64;
    }
    Some(v)
}

/// A non-negative decimal (`123`, `123.456`, `.5`, `1e3`) times 10^`pow10`, truncated.
/// Plain decimals are converted exactly; exponent forms go through `f64`.
pub fn parse_scaled(b: &[u8], pow10: u32) -> Option<u64> {
    let b = b.strip_prefix(b"+").unwrap_or(b);
    if b.is_empty() {
        return None;
    }
    let (int, frac) = match b.iter().position(|&c| c == b'.') {
        Some(p) => (&b[..p], &b[p + 1..]),
        None => (b, &b[..0]),
    };
    let scale = 10u64.checked_pow(pow10)?;
    let digits = |s: &[u8]| s.iter().all(u8::is_ascii_digit);
    if digits(int) && digits(frac) && !(int.is_empty() && frac.is_empty()) {
        let i = if int.is_empty() { 0 } else { parse_u64(int)? };
        let mut v = i.checked_mul(scale)?;
        let mut unit = scale;
        for &c in frac {
            unit /= 10;
            if unit == 0 {
                break;
            }
            v = v.checked_add((c - b'0') as u64 * unit)?;
        }
        return Some(v);
    }
    // Exponent notation and the like: go through f64.
    let s = std::str::from_utf8(b).ok()?;
    let f: f64 = s.parse().ok()?;
    let x = f * scale as f64;
    if !(0.0..1.8e19).contains(&x) {
        return None;
    }
    Some(x as u64)
}

/// `a * b` with an error instead of overflow.
#[inline]
pub(crate) fn mul(a: u64, b: u64, what: &str) -> Result<u64, String> {
    a.checked_mul(b)
        .ok_or_else(|| format!("{what} {a} x {b} overflows"))
}

/// Writes `ns` as decimal seconds with 9 decimals.
pub(crate) fn write_secs(w: &mut dyn std::io::Write, ns: u64) -> std::io::Result<()> {
    write!(w, "{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(parse_u64(b"0"), Some(0));
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        assert_eq!(parse_u64(b"99999999999999999999"), None);
        assert_eq!(parse_u64(b"-1"), None);
        assert_eq!(parse_u64(b""), None);
        assert_eq!(parse_u64(b"1a"), None);
        assert_eq!(
            parse_scaled(b"1456095145.133076000", 9),
            Some(1_456_095_145_133_076_000)
        );
        assert_eq!(parse_scaled(b"0.5", 9), Some(500_000_000));
        assert_eq!(parse_scaled(b".5", 3), Some(500));
        assert_eq!(parse_scaled(b"12", 0), Some(12));
        assert_eq!(parse_scaled(b"12.9", 0), Some(12));
        assert_eq!(parse_scaled(b"1.0000000019", 9), Some(1_000_000_001));
        assert_eq!(parse_scaled(b"1e3", 9), Some(1_000_000_000_000));
        assert_eq!(parse_scaled(b"-1", 9), None);
        assert_eq!(parse_scaled(b".", 9), None);
        assert_eq!(parse_scaled(b"nan", 9), None);
        assert_eq!(parse_scaled(b"99999999999", 9), None);
        assert_eq!(parse_hex(b"2a"), Some(0x2a));
        assert_eq!(parse_hex(b"zz"), None);
    }

    #[test]
    fn fields() {
        let f = Fields::csv(b" 1, R ,3,,x", &["a", "b", "c", "d", "e"]);
        assert_eq!(f.len(), 5);
        assert_eq!(f.bytes(1).unwrap(), b"R");
        assert!(!f.has(3));
        assert_eq!(
            f.u64(4).unwrap_err(),
            "column 5 (e): 'x' is not a whole number"
        );
        assert_eq!(f.bytes(7).unwrap_err(), "column 8 is missing");
        let f = Fields::ws(b"  8,0  3 1\t0.5 ", &[]);
        assert_eq!(f.len(), 4);
        assert_eq!(f.scaled(3, 9).unwrap(), 500_000_000);
        let many = b"1,2,3,4,5,6,7,8,9,10,11,12,13,14";
        assert_eq!(Fields::csv(many, &[]).len(), 14);
    }
}
