//! The trace formats: one file each, with a record parser and a writer.

pub mod alibaba;
pub mod arc;
pub mod blkparse;
pub mod disksim;
pub mod lcs_csv;
pub mod msr;
pub mod oracle;
pub mod simple;
pub mod spc;
pub mod systor;
pub mod tencent;
pub mod vscsi;

use std::fmt;
use std::str::FromStr;
use tiercache_engine::{Op, Request};

/// A trace format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    Msr,
    Systor,
    Tencent,
    Alibaba,
    Spc,
    Disksim,
    Arc,
    Blkparse,
    LcsCsv,
    OracleGeneral,
    Vscsi,
    Simple,
}

impl Format {
    pub const ALL: [Format; 12] = [
        Format::Simple,
        Format::Msr,
        Format::Systor,
        Format::Tencent,
        Format::Alibaba,
        Format::Spc,
        Format::Disksim,
        Format::Arc,
        Format::Blkparse,
        Format::LcsCsv,
        Format::OracleGeneral,
        Format::Vscsi,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Format::Msr => "msr",
            Format::Systor => "systor",
            Format::Tencent => "tencent",
            Format::Alibaba => "alibaba",
            Format::Spc => "spc",
            Format::Disksim => "disksim",
            Format::Arc => "arc",
            Format::Blkparse => "blkparse",
            Format::LcsCsv => "lcs-csv",
            Format::OracleGeneral => "oracle-general",
            Format::Vscsi => "vscsi",
            Format::Simple => "simple",
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Format::Msr => "MSR Cambridge CSV: Timestamp(FILETIME),Hostname,DiskNumber,Type,Offset,Size,ResponseTime",
            Format::Systor => "SYSTOR'17 CSV: Timestamp,Response,IOType,LUN,Offset,Size (header)",
            Format::Tencent => "Tencent CBS CSV: Timestamp,Offset(sectors),Size(sectors),IOType(0 r/1 w),VolumeID",
            Format::Alibaba => "Alibaba block CSV: device_id,opcode(R/W),offset,length,timestamp(us)",
            Format::Spc => "SPC/UMass CSV: ASU,LBA(sectors),Size(bytes),Opcode(r/w),Timestamp(s)",
            Format::Disksim => "DiskSim ASCII: arrival_ns device start_sector size_sectors type(1 r/0 w)",
            Format::Arc => "ARC .lis: start_block num_blocks ignore request_number (reads; 512 B blocks)",
            Format::Blkparse => "blkparse text: dev cpu seq time pid action RWBS sector + count [proc]",
            Format::LcsCsv => "libCacheSim csv: version,time,op(SCSI hex),size,lbn (header)",
            Format::OracleGeneral => "libCacheSim oracleGeneral binary: <u32 time, u64 id, u32 size, i64 next>",
            Format::Vscsi => "VMware vscsi v1 binary: <u32 sn, u32 len, u32 nSG, u16 cmd, u16 ver, u64 lbn, u64 ts_us>",
            Format::Simple => "tiercache CSV: time_ns,op,offset,len[,class[,volume[,fua]]] (header)",
        }
    }

    /// Whether records are fixed-size binary.
    pub fn is_binary(self) -> bool {
        matches!(self, Format::OracleGeneral | Format::Vscsi)
    }

    /// Record size of binary formats.
    pub fn record_size(self) -> usize {
        match self {
            Format::OracleGeneral => oracle::RECORD,
            Format::Vscsi => vscsi::RECORD,
            _ => 0,
        }
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
        let f = match t.as_str() {
            "msr" | "msr-cambridge" => Format::Msr,
            "systor" | "systor17" => Format::Systor,
            "tencent" | "tencent-cbs" => Format::Tencent,
            "alibaba" | "ali" => Format::Alibaba,
            "spc" | "umass" => Format::Spc,
            "disksim" | "mqsim" => Format::Disksim,
            "arc" | "lis" => Format::Arc,
            "blkparse" | "blktrace" => Format::Blkparse,
            "lcs-csv" | "cloudphysics-csv" | "libcachesim-csv" => Format::LcsCsv,
            "oracle-general" | "oraclegeneral" => Format::OracleGeneral,
            "vscsi" => Format::Vscsi,
            "simple" | "csv" | "tiercache" => Format::Simple,
            _ => {
                return Err(format!(
                    "unknown trace format '{s}'; known: {} (or auto)",
                    Format::ALL.map(|f| f.name()).join(", ")
                ))
            }
        };
        Ok(f)
    }
}

/// State a parser or writer may need.
#[derive(Clone, Debug)]
pub struct Ctx {
    /// Bytes per block (ARC, oracleGeneral).
    pub block_size: u64,
    pub blkparse_action: u8,
}

/// A text line's fields, split on `sep`, with helpers that name the column on error.
pub(crate) struct Fields<'a> {
    parts: Vec<&'a str>,
    names: &'static [&'static str],
}

impl<'a> Fields<'a> {
    pub fn csv(line: &'a str, names: &'static [&'static str]) -> Self {
        Fields {
            parts: line.split(',').map(str::trim).collect(),
            names,
        }
    }

    pub fn ws(line: &'a str, names: &'static [&'static str]) -> Self {
        Fields {
            parts: line.split_ascii_whitespace().collect(),
            names,
        }
    }

    pub fn len(&self) -> usize {
        self.parts.len()
    }

    pub fn need(&self, n: usize) -> Result<(), String> {
        if self.parts.len() < n {
            Err(format!(
                "expected at least {n} fields ({}), found {}",
                self.names.join(","),
                self.parts.len()
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

    pub fn str(&self, i: usize) -> Result<&'a str, String> {
        self.parts
            .get(i)
            .copied()
            .ok_or_else(|| format!("{} is missing", self.name(i)))
    }

    pub fn u64(&self, i: usize) -> Result<u64, String> {
        let s = self.str(i)?;
        s.parse::<u64>()
            .map_err(|_| format!("{}: '{s}' is not a whole number", self.name(i)))
    }

    pub fn f64(&self, i: usize) -> Result<f64, String> {
        let s = self.str(i)?;
        match s.parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(v),
            _ => Err(format!("{}: '{s}' is not a number", self.name(i))),
        }
    }

    pub fn hex(&self, i: usize) -> Result<u64, String> {
        let s = self.str(i)?;
        let t = s.trim_start_matches("0x").trim_start_matches("0X");
        u64::from_str_radix(t, 16)
            .map_err(|_| format!("{}: '{s}' is not a hex number", self.name(i)))
    }
}

/// Seconds (float) to nanoseconds, refusing negative or absurd values.
pub(crate) fn secs_to_ns(s: f64) -> Result<u64, String> {
    if !(0.0..1.8e10).contains(&s) {
        return Err(format!("timestamp {s} s is out of range"));
    }
    Ok((s * 1e9).round() as u64)
}

/// `a * b` with an error instead of overflow.
pub(crate) fn mul(a: u64, b: u64, what: &str) -> Result<u64, String> {
    a.checked_mul(b)
        .ok_or_else(|| format!("{what} {a} x {b} overflows"))
}

pub(crate) fn req(time_ns: u64, op: Op, offset: u64, len: u64) -> Request {
    Request::new(time_ns, op, offset, len)
}
