//! Opening traces (decompression by magic bytes, format detection) and the streaming reader
//! and writer.

use crate::formats::{self, Ctx, Format};
use crate::{Location, ReadOptions, TraceError};
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use tiercache_engine::Request;

const BUF: usize = 1 << 17;

fn open_raw(path: &Path) -> Result<Box<dyn BufRead + Send>, TraceError> {
    let f = File::open(path).map_err(|e| TraceError::file(path, format!("cannot open: {e}")))?;
    let mut r = BufReader::with_capacity(BUF, f);
    let head = r
        .fill_buf()
        .map_err(|e| TraceError::file(path, format!("cannot read: {e}")))?
        .to_vec();
    let inner: Box<dyn Read + Send> = if head.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::MultiGzDecoder::new(r))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Box::new(
            zstd::stream::read::Decoder::with_buffer(r)
                .map_err(|e| TraceError::file(path, format!("zstd: {e}")))?,
        )
    } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        Box::new(xz2::read::XzDecoder::new_multi_decoder(r))
    } else if head.starts_with(b"BZh") {
        Box::new(bzip2::read::MultiBzDecoder::new(r))
    } else {
        return Ok(Box::new(r));
    };
    Ok(Box::new(BufReader::with_capacity(BUF, inner)))
}

fn ctx_of(opts: &ReadOptions) -> Ctx {
    Ctx {
        block_size: opts.block_size.unwrap_or(512).max(1),
        blkparse_action: opts.blkparse_action as u8,
    }
}

/// Guesses the format from the first bytes (after decompression) and the file name.
pub fn detect(path: &Path) -> Result<Format, TraceError> {
    let mut r = open_raw(path)?;
    let mut head = Vec::with_capacity(1 << 16);
    (&mut r)
        .take(1 << 16)
        .read_to_end(&mut head)
        .map_err(|e| TraceError::file(path, format!("cannot read: {e}")))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    detect_bytes(&head, &name).map_err(|m| TraceError::file(path, m))
}

fn detect_bytes(head: &[u8], name: &str) -> Result<Format, String> {
    let ask = "give --format NAME (see `tiercache trace formats`)";
    if head.is_empty() {
        return Err(format!("the trace is empty; cannot tell its format: {ask}"));
    }
    let binary = head.iter().take(4096).any(|&b| b == 0 || (b < 9 && b != 0));
    if binary {
        if formats::vscsi::plausible(head) || name.contains("vscsi") {
            return Ok(Format::Vscsi);
        }
        if name.contains("oraclegeneral") || name.contains("oracle") {
            return Ok(Format::OracleGeneral);
        }
        return Err(format!(
            "binary data that is not vscsi v1; it may be oracle-general (24-byte records) or \
             something else: {ask}"
        ));
    }
    let text = String::from_utf8_lossy(head);
    let mut lines = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'));
    let Some(first) = lines.next() else {
        return Err(format!("no records in the first 64 KiB: {ask}"));
    };
    if first.starts_with("version,time,op,size,lbn") {
        return Ok(Format::LcsCsv);
    }
    if first.starts_with("Timestamp,Response,IOType") {
        return Ok(Format::Systor);
    }
    if first.starts_with("time_ns,op") {
        return Ok(Format::Simple);
    }
    // blkparse: "maj,min cpu seq time pid action rwbs ..."
    let ws: Vec<&str> = first.split_ascii_whitespace().collect();
    if ws.len() >= 7
        && ws[0]
            .split_once(',')
            .is_some_and(|(a, b)| a.parse::<u32>().is_ok() && b.parse::<u32>().is_ok())
    {
        return Ok(Format::Blkparse);
    }
    let num = |s: &str| s.parse::<f64>().is_ok();
    let csv: Vec<&str> = first.split(',').map(str::trim).collect();
    if csv.len() >= 7 && matches!(csv[3], "Read" | "Write") {
        return Ok(Format::Msr);
    }
    if csv.len() >= 5 {
        let mut candidates = Vec::new();
        if matches!(csv[1], "R" | "W") && num(csv[0]) && num(csv[2]) && num(csv[3]) && num(csv[4]) {
            candidates.push(Format::Alibaba);
        }
        if matches!(csv[3], "r" | "w" | "R" | "W")
            && num(csv[0])
            && num(csv[1])
            && num(csv[2])
            && num(csv[4])
        {
            candidates.push(Format::Spc);
        }
        if matches!(csv[3], "0" | "1") && csv.iter().take(5).all(|s| s.parse::<u64>().is_ok()) {
            candidates.push(Format::Tencent);
        }
        if candidates.len() == 1 {
            return Ok(candidates[0]);
        }
        if candidates.len() > 1 {
            return Err(format!(
                "ambiguous: the records fit {}: {ask}",
                candidates
                    .iter()
                    .map(|f| f.name())
                    .collect::<Vec<_>>()
                    .join(" and ")
            ));
        }
    }
    if ws.len() == 5 && ws.iter().all(|s| num(s)) {
        return Ok(Format::Disksim);
    }
    if ws.len() == 4 && ws.iter().all(|s| s.parse::<u64>().is_ok()) {
        return Ok(Format::Arc);
    }
    if name.ends_with(".lis") || name.contains(".lis.") {
        return Ok(Format::Arc);
    }
    Err(format!(
        "cannot tell the format from its first line '{}': {ask}",
        first.chars().take(80).collect::<String>()
    ))
}

/// Opens a trace for streaming; `format` None = [`detect`].
pub fn open(
    path: &Path,
    format: Option<Format>,
    opts: &ReadOptions,
) -> Result<TraceReader, TraceError> {
    let format = match format {
        Some(f) => f,
        None => detect(path)?,
    };
    Ok(TraceReader {
        path: path.to_path_buf(),
        format,
        ctx: ctx_of(opts),
        skip_bad: opts.skip_bad,
        src: open_raw(path)?,
        line: Vec::with_capacity(256),
        lineno: 0,
        rec: vec![0; format.record_size()],
        recno: 0,
        first_time: None,
        skipped: 0,
        first_error: None,
        done: false,
    })
}

/// A streaming trace reader: an iterator of requests (or the first error).
///
/// Times are nanoseconds since the first record (saturating at 0 for records that come
/// earlier: some traces are not sorted).
pub struct TraceReader {
    path: PathBuf,
    format: Format,
    ctx: Ctx,
    skip_bad: bool,
    src: Box<dyn BufRead + Send>,
    line: Vec<u8>,
    lineno: u64,
    rec: Vec<u8>,
    recno: u64,
    first_time: Option<u64>,
    skipped: u64,
    first_error: Option<TraceError>,
    done: bool,
}

enum Got {
    Req(Request),
    Skip,
    Bad(Location, String),
    Eof,
    Fail(TraceError),
}

impl TraceReader {
    pub fn format(&self) -> Format {
        self.format
    }

    /// Malformed records skipped (with `skip_bad`).
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// The first malformed record's error, when records were skipped.
    pub fn first_error(&self) -> Option<&TraceError> {
        self.first_error.as_ref()
    }

    fn parse_line(&self, line: &str) -> Result<Option<Request>, String> {
        use formats::*;
        let c = &self.ctx;
        match self.format {
            Format::Msr => msr::parse(line, c),
            Format::Systor => systor::parse(line, c),
            Format::Tencent => tencent::parse(line, c),
            Format::Alibaba => alibaba::parse(line, c),
            Format::Spc => spc::parse(line, c),
            Format::Disksim => disksim::parse(line, c),
            Format::Arc => arc::parse(line, c),
            Format::Blkparse => blkparse::parse(line, c),
            Format::LcsCsv => lcs_csv::parse(line, c),
            Format::Simple => simple::parse(line, c),
            Format::OracleGeneral | Format::Vscsi => unreachable!("binary"),
        }
    }

    fn next_raw(&mut self) -> Got {
        if self.format.is_binary() {
            let n = self.rec.len();
            let mut got = 0;
            while got < n {
                match self.src.read(&mut self.rec[got..]) {
                    Ok(0) => break,
                    Ok(k) => got += k,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        return Got::Fail(TraceError::file(&self.path, format!("read error: {e}")))
                    }
                }
            }
            if got == 0 {
                return Got::Eof;
            }
            self.recno += 1;
            let loc = Location::Record {
                index: self.recno,
                offset: (self.recno - 1) * n as u64,
            };
            if got < n {
                return Got::Bad(loc, format!("truncated record: {got} of {n} bytes"));
            }
            let res = match self.format {
                Format::OracleGeneral => formats::oracle::parse(&self.rec, &self.ctx),
                _ => formats::vscsi::parse(&self.rec, &self.ctx),
            };
            return match res {
                Ok(Some(r)) => Got::Req(r),
                Ok(None) => Got::Skip,
                Err(m) => Got::Bad(loc, m),
            };
        }
        self.line.clear();
        match self.src.read_until(b'\n', &mut self.line) {
            Ok(0) => return Got::Eof,
            Ok(_) => {}
            Err(e) => return Got::Fail(TraceError::file(&self.path, format!("read error: {e}"))),
        }
        self.lineno += 1;
        let loc = Location::Line(self.lineno);
        let Ok(s) = std::str::from_utf8(&self.line) else {
            return Got::Bad(
                loc,
                "not text (invalid UTF-8); is this a binary format?".into(),
            );
        };
        let s = s.trim_end_matches(['\n', '\r']);
        if s.trim().is_empty() {
            return Got::Skip;
        }
        match self.parse_line(s) {
            Ok(Some(r)) => Got::Req(r),
            Ok(None) => Got::Skip,
            Err(m) => Got::Bad(loc, m),
        }
    }
}

impl Iterator for TraceReader {
    type Item = Result<Request, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        loop {
            match self.next_raw() {
                Got::Req(mut r) => {
                    let t0 = *self.first_time.get_or_insert(r.time_ns);
                    r.time_ns = r.time_ns.saturating_sub(t0);
                    return Some(Ok(r));
                }
                Got::Skip => continue,
                Got::Eof => {
                    self.done = true;
                    return None;
                }
                Got::Fail(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
                Got::Bad(location, message) => {
                    let e = TraceError {
                        path: self.path.clone(),
                        location,
                        message,
                    };
                    if self.skip_bad {
                        self.skipped += 1;
                        self.first_error.get_or_insert(e);
                        continue;
                    }
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }
}

enum Sink {
    Plain(BufWriter<File>),
    Gz(flate2::write::GzEncoder<BufWriter<File>>),
    Zst(zstd::stream::write::Encoder<'static, BufWriter<File>>),
    Xz(xz2::write::XzEncoder<BufWriter<File>>),
    Bz(bzip2::write::BzEncoder<BufWriter<File>>),
}

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Sink::Plain(w) => w.write(b),
            Sink::Gz(w) => w.write(b),
            Sink::Zst(w) => w.write(b),
            Sink::Xz(w) => w.write(b),
            Sink::Bz(w) => w.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Sink::Plain(w) => w.flush(),
            Sink::Gz(w) => w.flush(),
            Sink::Zst(w) => w.flush(),
            Sink::Xz(w) => w.flush(),
            Sink::Bz(w) => w.flush(),
        }
    }
}

impl Sink {
    fn finish(self) -> io::Result<()> {
        let mut inner = match self {
            Sink::Plain(w) => w,
            Sink::Gz(w) => w.finish()?,
            Sink::Zst(w) => w.finish()?,
            Sink::Xz(w) => w.finish()?,
            Sink::Bz(w) => w.finish()?,
        };
        inner.flush()
    }
}

/// Writes requests in a format; compressed when the path ends in .gz, .zst, .xz or .bz2.
pub struct TraceWriter {
    format: Format,
    ctx: Ctx,
    sink: Option<Sink>,
    sn: u32,
    oracle: Vec<(u32, u64, u32)>,
    path: PathBuf,
}

/// Creates a trace file.
pub fn open_writer(path: &Path, format: Format) -> Result<TraceWriter, TraceError> {
    let f =
        File::create(path).map_err(|e| TraceError::file(path, format!("cannot create: {e}")))?;
    let w = BufWriter::with_capacity(BUF, f);
    let name = path.to_string_lossy().to_ascii_lowercase();
    let mut sink = if name.ends_with(".gz") {
        Sink::Gz(flate2::write::GzEncoder::new(
            w,
            flate2::Compression::default(),
        ))
    } else if name.ends_with(".zst") {
        Sink::Zst(
            zstd::stream::write::Encoder::new(w, 3)
                .map_err(|e| TraceError::file(path, format!("zstd: {e}")))?,
        )
    } else if name.ends_with(".xz") {
        Sink::Xz(xz2::write::XzEncoder::new(w, 6))
    } else if name.ends_with(".bz2") {
        Sink::Bz(bzip2::write::BzEncoder::new(
            w,
            bzip2::Compression::default(),
        ))
    } else {
        Sink::Plain(w)
    };
    let header = match format {
        Format::Simple => Some(formats::simple::HEADER),
        Format::Systor => Some(formats::systor::HEADER),
        Format::LcsCsv => Some(formats::lcs_csv::HEADER),
        _ => None,
    };
    if let Some(h) = header {
        writeln!(sink, "{h}").map_err(|e| TraceError::file(path, format!("write error: {e}")))?;
    }
    Ok(TraceWriter {
        format,
        ctx: Ctx {
            block_size: 512,
            blkparse_action: b'Q',
        },
        sink: Some(sink),
        sn: 0,
        oracle: Vec::new(),
        path: path.to_path_buf(),
    })
}

impl TraceWriter {
    /// Block size for ARC and oracleGeneral ids (default 512).
    pub fn set_block_size(&mut self, bs: u64) {
        self.ctx.block_size = bs.max(1);
    }

    pub fn write(&mut self, r: &Request) -> Result<(), TraceError> {
        use formats::*;
        let c = &self.ctx;
        let w = self.sink.as_mut().expect("writer used after finish");
        let res = match self.format {
            Format::Msr => msr::write(w, r, c),
            Format::Systor => systor::write(w, r, c),
            Format::Tencent => tencent::write(w, r, c),
            Format::Alibaba => alibaba::write(w, r, c),
            Format::Spc => spc::write(w, r, c),
            Format::Disksim => disksim::write(w, r, c),
            Format::Arc => arc::write(w, r, c),
            Format::Blkparse => blkparse::write(w, r, c),
            Format::LcsCsv => lcs_csv::write(w, r, c),
            Format::Simple => simple::write(w, r, c),
            Format::Vscsi => {
                self.sn = self.sn.wrapping_add(1);
                vscsi::write(w, r, self.sn)
            }
            Format::OracleGeneral => {
                let len = u32::try_from(r.len)
                    .map_err(|_| TraceError::file(&self.path, "request longer than 4 GiB"))?;
                self.oracle.push((
                    (r.time_ns / 1_000_000_000) as u32,
                    r.offset / c.block_size,
                    len,
                ));
                Ok(())
            }
        };
        res.map_err(|e| TraceError::file(&self.path, format!("write error: {e}")))
    }

    /// Flushes and closes the file (finishing compression).
    pub fn finish(mut self) -> Result<(), TraceError> {
        let mut sink = self.sink.take().expect("finish once");
        let err = |e: io::Error| TraceError::file(&self.path, format!("write error: {e}"));
        if self.format == Format::OracleGeneral {
            sink.write_all(&formats::oracle::encode_all(&self.oracle))
                .map_err(err)?;
        }
        sink.finish().map_err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_from_first_lines() {
        let d = |s: &str| detect_bytes(s.as_bytes(), "x");
        assert_eq!(
            d("version,time,op,size,lbn\n1,2,28,512,3\n"),
            Ok(Format::LcsCsv)
        );
        assert_eq!(
            d("128166385295514663,hm,0,Write,9056014336,2048,2833\n"),
            Ok(Format::Msr)
        );
        assert_eq!(
            d("Timestamp,Response,IOType,LUN,Offset,Size\n"),
            Ok(Format::Systor)
        );
        assert_eq!(d("1538323200,4247200,128,1,1058\n"), Ok(Format::Tencent));
        assert_eq!(d("3,R,1024,4096,1577808000000000\n"), Ok(Format::Alibaba));
        assert_eq!(d("0,303567,3584,w,0.000000\n"), Ok(Format::Spc));
        assert_eq!(d("11413000 0 657728 16 1\n"), Ok(Format::Disksim));
        assert_eq!(d("230027 8 0 0\n"), Ok(Format::Arc));
        assert_eq!(
            d("  8,0    3        1     0.000000000  697  Q   R 223490 + 8 [kjournald]\n"),
            Ok(Format::Blkparse)
        );
        assert_eq!(d("time_ns,op,offset,len\n"), Ok(Format::Simple));
        let e = d("hello world\n").unwrap_err();
        assert!(e.contains("--format"), "{e}");
    }
}
