//! FIU traces with content (SyLab, Florida International University: Koller and Rangaswami,
//! FAST '10): one text line per block,
//! `ts pid process lba size op major minor md5`, space separated:
//!
//! - ts: nanoseconds; pid; process name (no spaces);
//! - lba and size in 512-byte sectors (size is the block: 8 for 4 KiB, 1 for 512 B);
//! - op `R` / `W`; major and minor device numbers (volume = `major << 20 | minor`);
//! - md5: 32 hex digits, the block's content hash.
//!
//! As a registered trace format (`--format fiu`) each line is one request (the MD5 is
//! checked, then dropped; volume `major << 20 | minor`, pid and process ignored); the writer
//! writes pid 0, process `-` and an all-zero MD5 (requests carry no content). [`read`]
//! keeps the MD5s, so it returns a [`ContentTrace`] rather than plain requests:
//! each line's fingerprint is the first 8 bytes of its MD5 (mixed with the block's position
//! in the line when lines are larger than the trace's blocks: an approximation of Nitro's
//! multi-pass extent fingerprints), and its compressed length comes from a content model
//! (the traces carry no compression information; the seed did the same).

use super::{blkparse, is_int, mul, ws_fields, Ctx, Fields, Written};
use crate::content::{mix, ContentModel, ContentTrace};
use std::io::{self, BufRead, Write};
use tiercache_engine::{Op, Request};

/// One parsed record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FiuRecord {
    pub ts_ns: u64,
    pub pid: u32,
    pub process: String,
    pub lba: u64,
    pub sectors: u64,
    pub op: Op,
    pub major: u32,
    pub minor: u32,
    pub md5: [u8; 16],
}

fn hex16(s: &str) -> Option<[u8; 16]> {
    if s.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Parses one line (`None` for blank lines).
pub fn parse(line: &str) -> Result<Option<FiuRecord>, String> {
    let t = line.trim();
    if t.is_empty() {
        return Ok(None);
    }
    const NAMES: [&str; 9] = [
        "ts", "pid", "process", "lba", "size", "op", "major", "minor", "md5",
    ];
    let f: Vec<&str> = t.split_ascii_whitespace().collect();
    if f.len() != 9 {
        return Err(format!(
            "expected 9 fields (ts pid process lba size op major minor md5), found {}",
            f.len()
        ));
    }
    let num = |i: usize| -> Result<u64, String> {
        f[i].parse::<u64>().map_err(|_| {
            format!(
                "column {} ({}): '{}' is not a whole number",
                i + 1,
                NAMES[i],
                f[i]
            )
        })
    };
    let op = match f[5] {
        "R" | "r" => Op::Read,
        "W" | "w" => Op::Write,
        o => return Err(format!("column 6 (op): '{o}' is not R or W")),
    };
    let md5 =
        hex16(f[8]).ok_or_else(|| format!("column 9 (md5): '{}' is not 32 hex digits", f[8]))?;
    Ok(Some(FiuRecord {
        ts_ns: num(0)?,
        pid: num(1)? as u32,
        process: f[2].to_string(),
        lba: num(3)?,
        sectors: num(4)?,
        op,
        major: num(6)? as u32,
        minor: num(7)? as u32,
        md5,
    }))
}

/// Writes one record.
pub fn write(w: &mut dyn Write, r: &FiuRecord) -> io::Result<()> {
    let hex: String = r.md5.iter().map(|b| format!("{b:02x}")).collect();
    writeln!(
        w,
        "{} {} {} {} {} {} {} {} {}",
        r.ts_ns,
        r.pid,
        r.process,
        r.lba,
        r.sectors,
        if r.op == Op::Read { "R" } else { "W" },
        r.major,
        r.minor,
        hex
    )
}

/// Reads a whole FIU trace into requests with content; errors name the line.
pub fn read(input: impl BufRead, name: &str, model: &ContentModel) -> Result<ContentTrace, String> {
    let ls = model.line_size;
    let mut t = ContentTrace::new(name, ls);
    let mut t0 = None;
    let mut buf = Vec::new();
    for (i, line) in input.lines().enumerate() {
        let line = line.map_err(|e| format!("{name}:{}: {e}", i + 1))?;
        let Some(r) = parse(&line).map_err(|e| format!("{name}:{}: {e}", i + 1))? else {
            continue;
        };
        let t0 = *t0.get_or_insert(r.ts_ns);
        let mut req = Request::new(
            r.ts_ns.saturating_sub(t0),
            r.op,
            r.lba * 512,
            r.sectors * 512,
        );
        req.volume = (r.major << 20) | r.minor;
        let h = u64::from_le_bytes(r.md5[..8].try_into().expect("16 bytes"));
        buf.clear();
        if let Some(blocks_per_line) = ls.checked_div(req.len) {
            let pos = (req.offset % ls).checked_div(req.len).unwrap_or(0);
            for _ in req.offset / ls..=(req.end() - 1) / ls {
                // A line made of several blocks: mix the block hash with its position so
                // that equal lines need equal blocks in equal places.
                let fp = if blocks_per_line > 1 {
                    mix(h ^ pos.wrapping_mul(0x9e37))
                } else {
                    h
                };
                buf.push(model.with_fp(fp));
            }
        }
        t.push(req, &buf);
    }
    Ok(t)
}

const FIELDS: [&str; 9] = [
    "ts", "pid", "process", "lba", "size", "op", "major", "minor", "md5",
];

fn is_md5(b: &[u8]) -> bool {
    b.len() == 32 && b.iter().all(u8::is_ascii_hexdigit)
}

/// One line as a request, without allocating (the registry's parser).
fn parse_request(line: &[u8], _ctx: &Ctx) -> Result<Option<Request>, String> {
    let f = Fields::ws(line, &FIELDS);
    if f.len() != 9 {
        return Err(format!(
            "expected 9 fields (ts pid process lba size op major minor md5), found {}",
            f.len()
        ));
    }
    let ts = f.u64(0)?;
    f.u32(1)?;
    let lba = f.u64(3)?;
    let sectors = f.u64(4)?;
    let op = match f.bytes(5)? {
        b"R" | b"r" => Op::Read,
        b"W" | b"w" => Op::Write,
        _ => return Err(f.err(5, "is not R or W")),
    };
    let (major, minor) = (f.u32(6)?, f.u32(7)?);
    if !is_md5(f.bytes(8)?) {
        return Err(f.err(8, "is not 32 hex digits"));
    }
    let volume = blkparse::volume(major, minor)
        .ok_or_else(|| format!("device {major},{minor}: major or minor too large"))?;
    let mut r = Request::new(
        ts,
        op,
        mul(lba, 512, "lba")?,
        mul(sectors, 512, "size in sectors")?,
    );
    r.volume = volume;
    Ok(Some(r))
}

fn fits(line: &[u8]) -> bool {
    let w = ws_fields(line);
    w.len() == 9
        && [0, 1, 3, 4, 6, 7].iter().all(|&i| is_int(w[i]))
        && matches!(w[5], b"R" | b"W" | b"r" | b"w")
        && is_md5(w[8])
}

const ZERO_MD5: &str = "00000000000000000000000000000000";

fn write_request(
    _: &mut super::WriteState,
    w: &mut dyn Write,
    r: &Request,
    _c: &Ctx,
    _n: u64,
) -> io::Result<Written> {
    let op = match r.op {
        Op::Read => "R",
        Op::Write => "W",
        Op::Trim | Op::Flush => return Ok(Written::Dropped),
    };
    let lba = r.offset / 512;
    writeln!(
        w,
        "{} 0 - {lba} {} {op} {} {} {ZERO_MD5}",
        r.time_ns,
        r.end().div_ceil(512) - lba,
        r.volume >> 20,
        r.volume & 0xf_ffff,
    )?;
    Ok(Written::Yes)
}

/// This format's registry entry.
pub const SPEC: super::Spec = super::Spec {
    name: "fiu",
    aliases: &["sylab"],
    description: "FIU/SyLab text with content hashes: ts_ns pid process lba size(sectors) op(R/W) major minor md5",
    has_op: true,
    record_size: 0,
    first_record: None,
    header: None,
    detect_header: None,
    name_hints: &["fiu"],
    fits,
    decides_alone: false,
    trust_name: false,
    parse: parse_request,
    write: Some(write_request),
    finish: None,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_errors() {
        let recs = vec![
            FiuRecord {
                ts_ns: 89_966_933_207_045,
                pid: 4893,
                process: "syslogd".into(),
                lba: 904_265_560,
                sectors: 8,
                op: Op::Write,
                major: 6,
                minor: 0,
                md5: *b"0123456789abcdef",
            },
            FiuRecord {
                ts_ns: 89_966_933_300_000,
                pid: 1,
                process: "init".into(),
                lba: 16,
                sectors: 8,
                op: Op::Read,
                major: 6,
                minor: 0,
                md5: *b"0123456789abcdef",
            },
        ];
        let mut out = Vec::new();
        for r in &recs {
            write(&mut out, r).unwrap();
        }
        let text = String::from_utf8(out).unwrap();
        let back: Vec<FiuRecord> = text.lines().map(|l| parse(l).unwrap().unwrap()).collect();
        assert_eq!(back, recs);
        let t = read(text.as_bytes(), "t.fiu", &ContentModel::new(4096, 1)).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t.requests[0].offset, 904_265_560 * 512);
        assert_eq!(
            t.requests[1].time_ns,
            89_966_933_300_000 - 89_966_933_207_045
        );
        // Same MD5, same fingerprint: a duplicate.
        assert_eq!(t.content(0)[0].fp, t.content(1)[0].fp);
        let bad = "1 2 p 3 8 X 6 0 0123456789abcdef0123456789abcdef\n";
        let e = read(bad.as_bytes(), "t.fiu", &ContentModel::new(4096, 1)).unwrap_err();
        assert!(e.contains("t.fiu:1") && e.contains("op"), "{e}");
        assert!(parse("1 2 p 3 8 R 6 0 xyz").unwrap_err().contains("md5"));
    }
}
