//! `tiercache reproduce dss` and `reproduce nitro` at a small scale: every row is printed beside
//! the seed's figure with its verdict, and the figures are sane (DSS wins the metadata walks,
//! data reduction raises the WEU read-hit ratio, compression gains extents nothing).

use std::path::Path;
use std::process::Command;

fn reproduce(name: &str, requests: &str, dir: &Path) -> (String, serde_json::Value) {
    let o = Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .args(["reproduce", name, "--requests", requests, "--out"])
        .arg(dir)
        .output()
        .expect("run tiercache");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "reproduce {name} failed:\n{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let json = std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap();
    (out, serde_json::from_str(&json).unwrap())
}

fn rows(v: &serde_json::Value) -> Vec<(String, String, String, String)> {
    v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap_or("").to_string();
            (s("what"), s("ours"), s("published"), s("verdict"))
        })
        .collect()
}

/// The number just before `suffix` in `text` (e.g. "15.2x vs LRU" -> 15.2).
fn number_before(text: &str, suffix: &str) -> f64 {
    let i = text
        .find(suffix)
        .unwrap_or_else(|| panic!("no '{suffix}' in '{text}'"));
    let head = text[..i].trim_end();
    let start = head
        .rfind(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .map_or(0, |j| j + 1);
    head[start..]
        .parse()
        .unwrap_or_else(|_| panic!("no number before '{suffix}' in '{text}'"))
}

/// "a / b / c" (with optional units) as numbers.
fn trio(text: &str) -> Vec<f64> {
    text.split(';')
        .next()
        .unwrap()
        .split('/')
        .map(|p| {
            p.trim()
                .trim_end_matches(['%', 's', ' '])
                .trim()
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("not a number: '{p}' in '{text}'"))
        })
        .collect()
}

const VERDICT_WORDS: [&str; 4] = ["same", "different", "no change", "not compared"];

#[test]
fn dss_tables_beside_the_seed_with_verdicts() {
    let dir = tempfile::tempdir().unwrap();
    let (out, v) = reproduce("dss", "20000", dir.path());
    assert_eq!(out.matches("verdict: ").count(), 1, "{out}");
    let rows = rows(&v);
    for disk in ["7200", "15K"] {
        // Per phase: times, speed-ups, the seed's speed-ups, and a verdict on both.
        for phase in ["Trans", "Prefind", "Archive", "Find", "Scan"] {
            let (_, ours, published, verdict) = rows
                .iter()
                .find(|r| r.0 == format!("{disk} Macro{phase}: s no cache / LRU / DSS"))
                .unwrap_or_else(|| panic!("no {disk} {phase} row:\n{out}"));
            assert!(published.contains("DSS ") && published.contains('x'));
            assert!(
                verdict.starts_with("vs no cache: ") && verdict.contains("; vs LRU: "),
                "{verdict}"
            );
            let t = trio(ours);
            assert!(t.iter().all(|x| *x > 0.0), "{ours}");
            // DSS keeps the metadata: the walks are faster than with LRU and no cache.
            if phase == "Prefind" || phase == "Find" {
                assert!(
                    number_before(ours, "x vs LRU") >= 1.5,
                    "{disk} {phase}: {ours}"
                );
                assert!(number_before(ours, "x vs no cache") >= 1.5, "{ours}");
            }
        }
        let rel = rows
            .iter()
            .find(|r| r.0 == format!("{disk} Table 3: relative performance"))
            .expect("Table 3 row");
        let t = trio(&rel.1);
        assert_eq!(t[0], 100.0);
        assert!(t[2] >= 100.0, "DSS slower than no cache: {}", rel.1);
        assert!(rel.2.contains("217 %") || rel.2.contains("176 %"));
        for r in rows.iter().filter(|r| r.0.starts_with(disk)) {
            assert!(
                VERDICT_WORDS.iter().any(|w| r.3.contains(w))
                    || r.0.contains("average IOPS")
                    || r.0.contains("with a watermark cleaner"),
                "row without a verdict: {r:?}"
            );
        }
    }
    // Table 4: both disks are priced (7200 from DEVICES.md, 15K from a 2010 list price).
    let t4 = |disk: &str| {
        rows.iter()
            .find(|r| r.0 == format!("{disk} Table 4: cost per MB per IOPS"))
            .unwrap()
            .clone()
    };
    assert!(t4("7200").1.contains("e-"), "{:?}", t4("7200"));
    assert!(t4("15K").1.contains("e-"), "{:?}", t4("15K"));
    assert!(t4("15K").2.contains("USD 5.47"));
    // The watermark-cleaner rows say which cache wins which phase.
    assert!(rows
        .iter()
        .any(|r| r.0.contains("with a watermark cleaner") && r.3.starts_with("LRU faster on")));
    assert!(!v["verdict"].as_str().unwrap().is_empty());
    let html = std::fs::read_to_string(dir.path().join("reproduce.html")).unwrap();
    assert!(html.contains("DSS 7200 RPM: cost per MB per IOPS (no cache = 1)"));
    assert!(html.contains("<th>verdict</th>"));
}

#[test]
fn nitro_variants_beside_the_seed_with_verdicts() {
    let dir = tempfile::tempdir().unwrap();
    let (out, v) = reproduce("nitro", "20000", dir.path());
    assert_eq!(out.matches("verdict: ").count(), 1, "{out}");
    let rows = rows(&v);
    let storm: Vec<_> = rows
        .iter()
        .filter(|r| r.0.starts_with("boot storm"))
        .collect();
    let get = |what: &str| {
        storm
            .iter()
            .find(|r| r.0.ends_with(what))
            .unwrap_or_else(|| panic!("no '{what}' row:\n{out}"))
    };
    let weu = trio(&get("read hit, WEU (ND,NC)/(ND,C)/(D,NC)/(D,C)").1);
    let ext = trio(&get("read hit, Extent (ND,NC)/(ND,C)/(D,NC)/(D,C)").1);
    assert_eq!(weu.len(), 4);
    // Data reduction helps WEU caching; dedup helps more than compression on a boot storm.
    assert!(weu[3] > weu[0] && weu[2] > weu[1], "{weu:?}");
    assert!(weu[1] > weu[0], "compression must add WEU hits: {weu:?}");
    // A compressed extent still takes a whole slot.
    assert_eq!(ext[0], ext[1], "{ext:?}");
    assert!(ext[2] > ext[0]);
    for what in [
        "WEU (D,C) vs WEU (ND,NC), read hit",
        "compression on WEU: (ND,C) vs (ND,NC)",
        "dedup on WEU: (D,NC) vs (ND,NC)",
        "dedup on extents: (D,NC) vs (ND,NC)",
        "Extent (D,NC) vs WEU (D,NC), read hit",
        "SSD erasures, WEU (4 variants)",
        "erasures with TRIM, Extent vs WEU (ND,NC)",
    ] {
        let r = get(what);
        assert!(
            VERDICT_WORDS.iter().any(|w| r.3.contains(w)),
            "no verdict: {r:?}"
        );
        assert!(!r.2.is_empty() && r.2 != "-", "no published figure: {r:?}");
    }
    assert!(get("WEU (D,C) vs WEU (ND,NC), read hit")
        .2
        .contains("+14 to +25 %"));
    let html = std::fs::read_to_string(dir.path().join("reproduce.html")).unwrap();
    assert!(
        html.contains("read-hit ratio per variant") && html.contains("SSD erasures per variant")
    );
}
