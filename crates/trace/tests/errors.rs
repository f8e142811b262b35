//! Malformed input: messages with file and line (or record and byte), skip-bad counting,
//! detection failures, truncated binary records.

use std::path::{Path, PathBuf};
use tiercache_engine::{Op, Request};
use tiercache_trace::{detect, open, Format, Location, ReadOptions, TraceError};

fn file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn first_error(path: &Path, f: Option<Format>) -> TraceError {
    open(path, f, &ReadOptions::default())
        .unwrap()
        .find_map(Result::err)
        .expect("an error")
}

fn lcs_with_bad_line_17() -> String {
    let mut s = String::from("version,time,op,size,lbn\n");
    for i in 2..=20 {
        if i == 17 {
            s.push_str("1,10,28,abc,100\n");
        } else {
            s.push_str(&format!("1,{i},2a,4096,{}\n", i * 8));
        }
    }
    s
}

#[test]
fn bad_line_names_file_line_column_and_value() {
    let dir = tempfile::tempdir().unwrap();
    let p = file(dir.path(), "cloud.csv", lcs_with_bad_line_17().as_bytes());
    let e = first_error(&p, None);
    assert_eq!(e.location, Location::Line(17));
    let msg = e.to_string();
    assert!(
        msg.ends_with("cloud.csv:17: column 4 (size): 'abc' is not a whole number"),
        "{msg}"
    );
    // The reader stops after the error.
    let n = open(&p, None, &ReadOptions::default()).unwrap().count();
    assert_eq!(n, 16, "15 requests and the error");
}

#[test]
fn messages_per_format() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(Format, &str, &str)] = &[
        (
            Format::Msr,
            "1,h,0,Erase,0,512,1\n",
            ":1: column 4 (Type): 'Erase' is not Read or Write",
        ),
        (
            Format::Msr,
            "1,h,0,Read,0\n",
            ":1: expected at least 6 fields",
        ),
        (
            Format::Systor,
            "Timestamp,Response,IOType,LUN,Offset,Size\n-1,0,R,0,0,512\n",
            ":2: column 1 (Timestamp): '-1' is not a non-negative number",
        ),
        (
            Format::Tencent,
            "1,2,3,2,5\n",
            ":1: column 4 (IOType): '2' is not 0 (read) or 1 (write)",
        ),
        (
            Format::Tencent,
            "1,2,3,1,99999999999\n",
            ":1: column 5 (VolumeID): '99999999999' is too large",
        ),
        (
            Format::Alibaba,
            "1,X,0,512,10\n",
            ":1: column 2 (opcode): 'X' is not R or W",
        ),
        (
            Format::Spc,
            "0,1,512,r,x\n",
            ":1: column 5 (Timestamp): 'x' is not a non-negative number",
        ),
        (
            Format::Disksim,
            "10 0 1 8\n",
            ":1: expected at least 5 fields",
        ),
        (
            Format::Arc,
            "1 z 0 0\n",
            ":1: column 2 (num_blocks): 'z' is not a whole number",
        ),
        (
            Format::Arc,
            "36028797018963968 1 0 0\n",
            ":1: start_block 36028797018963968 x 512 overflows",
        ),
        (
            Format::Blkparse,
            "  8,0 0 1 0.1 5 Q R\n",
            ":1: column 7 (RWBS): 'R' event has no 'sector + count'",
        ),
        (
            Format::LcsCsv,
            "1,1,12,512,0\n",
            ":1: column 3 (op): '12' is not a SCSI read, write",
        ),
        (
            Format::Simple,
            "0,erase,0,512\n",
            ":1: column 2 (op): 'erase' is not read, write, trim or flush",
        ),
        (
            Format::Simple,
            "0,read,0,512,32\n",
            ":1: column 5 (class): '32' is above 31",
        ),
        (
            Format::Simple,
            "0,read,0,512,1,2,maybe\n",
            ":1: column 7 (fua): 'maybe' is not 0 or 1",
        ),
    ];
    for (i, (f, text, want)) in cases.iter().enumerate() {
        let p = file(dir.path(), &format!("case{i}.txt"), text.as_bytes());
        let msg = first_error(&p, Some(*f)).to_string();
        assert!(msg.contains(want), "{f}: got '{msg}', want '{want}'");
        assert!(msg.contains(&format!("case{i}.txt")), "{msg}");
    }
}

#[test]
fn skip_bad_counts_and_keeps_the_first_error() {
    let dir = tempfile::tempdir().unwrap();
    let text = "\u{feff}time_ns,op,offset,len\r\n0,read,0,4096\n5,read,x,4096\n6,write,8192,512\n7,bogus,0,1\n\n# comment\n8,trim,0,4096\n";
    let p = file(dir.path(), "s.csv", text.as_bytes());
    let opts = ReadOptions {
        skip_bad: true,
        ..Default::default()
    };
    let mut r = open(&p, None, &opts).unwrap();
    let got: Vec<Request> = r.by_ref().map(Result::unwrap).collect();
    assert_eq!(
        got.iter().map(|r| r.op).collect::<Vec<_>>(),
        [Op::Read, Op::Write, Op::Trim]
    );
    assert_eq!(r.skipped(), 2);
    let e = r.first_error().unwrap();
    assert_eq!(e.location, Location::Line(3));
    assert!(e.to_string().contains("column 3 (offset): 'x'"), "{e}");
}

#[test]
fn ambiguous_and_unknown_detection() {
    let dir = tempfile::tempdir().unwrap();
    // A headerless record that Tencent and libCacheSim csv both read.
    let p = file(dir.path(), "x.csv", b"1,5,28,0,1\n");
    let msg = detect(&p).unwrap_err().to_string();
    assert!(msg.contains("ambiguous"), "{msg}");
    assert!(msg.contains("'tencent' and 'lcs-csv'"), "{msg}");
    assert!(msg.contains("--format"), "{msg}");
    assert!(open(&p, None, &ReadOptions::default()).is_err());
    // Explicit formats read it.
    let r = open(&p, Some(Format::Tencent), &ReadOptions::default())
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(r.offset, 5 * 512);

    let p = file(dir.path(), "y.txt", b"hello there\n");
    let msg = detect(&p).unwrap_err().to_string();
    assert!(
        msg.contains("fits no known format") && msg.contains("--format"),
        "{msg}"
    );
    let p = file(dir.path(), "empty", b"");
    assert!(detect(&p).unwrap_err().to_string().contains("empty"));
    assert_eq!(
        open(&p, Some(Format::Msr), &ReadOptions::default())
            .unwrap()
            .count(),
        0
    );
    let p = file(dir.path(), "z.bin", &[7u8; 100]);
    let msg = detect(&p).unwrap_err().to_string();
    assert!(msg.contains("neither vscsi nor oracleGeneral"), "{msg}");
    let e = "nope".parse::<Format>().unwrap_err();
    assert!(e.contains("lcs-csv") && e.contains("oracle-general"), "{e}");
    assert_eq!("cloudphysics-csv".parse::<Format>(), Ok(Format::LcsCsv));
    assert!(open(
        Path::new("/nonexistent/t.csv"),
        None,
        &ReadOptions::default()
    )
    .err()
    .unwrap()
    .to_string()
    .contains("cannot open"));
}

fn vscsi_record(sn: u32, cmd: u16, lbn: u64, ts: u64) -> [u8; 32] {
    let mut r = [0u8; 32];
    r[0..4].copy_from_slice(&sn.to_le_bytes());
    r[4..8].copy_from_slice(&4096u32.to_le_bytes());
    r[12..14].copy_from_slice(&cmd.to_le_bytes());
    r[14..16].copy_from_slice(&0x0100u16.to_le_bytes());
    r[16..24].copy_from_slice(&lbn.to_le_bytes());
    r[24..32].copy_from_slice(&ts.to_le_bytes());
    r
}

#[test]
fn truncated_and_bad_binary_records() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&vscsi_record(1, 0x28, 10, 1000));
    bytes.extend_from_slice(&vscsi_record(2, 0x12, 10, 2000)); // INQUIRY: not modelled
    bytes.extend_from_slice(&vscsi_record(3, 0x2a, 20, 3000));
    bytes.extend_from_slice(&vscsi_record(4, 0x2a, 30, 4000)[..20]);
    let p = file(dir.path(), "t.vscsi", &bytes);
    let mut r = open(&p, None, &ReadOptions::default()).unwrap();
    assert_eq!(r.next().unwrap().unwrap().offset, 10 * 512);
    let e = r.next().unwrap().unwrap_err();
    assert_eq!(
        e.location,
        Location::Record {
            index: 2,
            offset: 32
        }
    );
    assert!(
        e.to_string()
            .contains("record 2 (byte 32): SCSI command 0x12"),
        "{e}"
    );
    assert!(r.next().is_none());

    let opts = ReadOptions {
        skip_bad: true,
        ..Default::default()
    };
    let mut r = open(&p, None, &opts).unwrap();
    let got: Vec<Request> = r.by_ref().map(Result::unwrap).collect();
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].time_ns, 2_000_000, "us -> ns, relative to the first");
    assert_eq!(r.skipped(), 2);
    let opts = ReadOptions::default();
    let e = open(&p, None, &opts)
        .unwrap()
        .filter_map(Result::err)
        .last()
        .unwrap();
    assert_eq!(
        e.location,
        Location::Record {
            index: 2,
            offset: 32
        }
    );

    // oracleGeneral: 1.5 records.
    let mut rec = Vec::new();
    rec.extend_from_slice(&5u32.to_le_bytes());
    rec.extend_from_slice(&7u64.to_le_bytes());
    rec.extend_from_slice(&512u32.to_le_bytes());
    rec.extend_from_slice(&(-1i64).to_le_bytes());
    rec.extend_from_slice(&rec.clone()[..12]);
    let p = file(dir.path(), "t.oracleGeneral", &rec);
    let mut r = open(&p, None, &ReadOptions::default()).unwrap();
    assert_eq!(r.next().unwrap().unwrap().offset, 7 * 512);
    let msg = r.next().unwrap().unwrap_err().to_string();
    assert!(
        msg.ends_with("t.oracleGeneral: record 2 (byte 24): truncated record: 12 of 24 bytes at the end of the trace"),
        "{msg}"
    );

    // A file that is not vscsi at all, read as vscsi.
    let p = file(dir.path(), "not.vscsi", &[0u8; 64]);
    let msg = first_error(&p, Some(Format::Vscsi)).to_string();
    assert!(msg.contains("not a vscsi record"), "{msg}");
}

#[test]
fn blkparse_actions_rwbs_and_summaries() {
    let dir = tempfile::tempdir().unwrap();
    let text = "\
  8,0    3        1     0.000000000  697  Q   R 223490 + 8 [kjournald]
  8,0    3        2     0.000002000  697  G   R 223490 + 8 [kjournald]
  8,0    3        3     0.000005000  697  D   R 223490 + 8 [kjournald]
  8,16   1        4     0.000100000  700  Q WFS 1000 + 16 [jbd2/sda1-8]
  8,16   1        5     0.000200000  700  Q FWS [jbd2/sda1-8]
  8,0    0        6     0.000300000  701  Q   D 4096 + 2048 [fstrim]
  8,0    0        7     0.000400000  701  Q  WM 64 + 8 [kworker/0:1]
  8,0    0        8     0.000500000    0  m   N cfq701 insert_request
  8,0    0        9     0.000600000  701  Q   N 0 + 0 [x]
259,3    0       10     0.000700000  701  Q  RA 8 + 8 [readahead]
  8,0    3       11     0.001000000    0  C   R 223490 + 8 [0]
CPU0 (8,0):
 Reads Queued:           1,        4KiB\t Writes Queued:           2,        8KiB
Total (8,0):
 Reads Queued:           1,        4KiB\t Writes Queued:           2,        8KiB

Throughput (R/W): 4KiB/s / 8KiB/s
";
    let p = file(dir.path(), "blk.txt", text.as_bytes());
    assert_eq!(detect(&p).unwrap(), Format::Blkparse);
    let q: Vec<Request> = open(&p, None, &ReadOptions::default())
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let summary: Vec<_> = q
        .iter()
        .map(|r| (r.time_ns, r.op, r.offset, r.len, r.volume, r.fua))
        .collect();
    let v8_0 = 8 << 20;
    assert_eq!(
        summary,
        [
            (0, Op::Read, 223490 * 512, 4096, v8_0, false),
            (100_000, Op::Write, 1000 * 512, 8192, v8_0 | 16, true),
            (200_000, Op::Flush, 0, 0, v8_0 | 16, false),
            (300_000, Op::Trim, 4096 * 512, 1 << 20, v8_0, false),
            (400_000, Op::Write, 64 * 512, 4096, v8_0, false),
            (700_000, Op::Read, 8 * 512, 4096, 259 << 20 | 3, false),
        ]
    );
    for (action, n) in [('D', 1), ('C', 1), ('G', 1), ('X', 0)] {
        let opts = ReadOptions {
            blkparse_action: action,
            ..Default::default()
        };
        let got = open(&p, Some(Format::Blkparse), &opts).unwrap().count();
        assert_eq!(got, n, "action {action}");
    }
}

#[test]
fn time_units() {
    let dir = tempfile::tempdir().unwrap();
    let read = |name: &str, text: &str, f: Format| -> Vec<u64> {
        let p = file(dir.path(), name, text.as_bytes());
        open(&p, Some(f), &ReadOptions::default())
            .unwrap()
            .map(|r| r.unwrap().time_ns)
            .collect()
    };
    // FILETIME ticks of 100 ns.
    assert_eq!(
        read(
            "m",
            "128166385295514663,hm,0,Write,0,512,1\n128166385295514878,hm,0,Read,0,512,1\n",
            Format::Msr
        ),
        [0, 21_500]
    );
    // Decimal seconds, exactly.
    assert_eq!(
        read(
            "s",
            "1456095145.133076000,0.1,R,0,0,512\n1456095145.133076001,0.1,W,0,0,512\n",
            Format::Systor
        ),
        [0, 1]
    );
    assert_eq!(
        read("a", "1,R,0,512,10\n1,W,0,512,25\n", Format::Alibaba),
        [0, 15_000]
    );
    assert_eq!(
        read("p", "0,1,512,r,0.5\n0,1,512,W,1.25\n", Format::Spc),
        [0, 750_000_000]
    );
    assert_eq!(
        read("d", "1000 0 1 8 1\n2500.9 0 1 8 0\n", Format::Disksim),
        [0, 1500]
    );
    assert_eq!(
        read("t", "10,1,1,0,1\n9,1,1,0,1\n12,1,1,1,1\n", Format::Tencent),
        [0, 0, 2_000_000_000]
    );
}
