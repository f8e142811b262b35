//! `tiercache sim --shards N`: the shard count in both outputs, the default of 1, and a
//! clear refusal where sharding does not run (timed runs, the log layout, the RAM tier).

use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .args(args)
        .output()
        .expect("run tiercache")
}

fn ok(args: &[&str]) -> String {
    let o = run(args);
    assert!(
        o.status.success(),
        "tiercache {args:?} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

const W: &str = "zipf:theta=0.9,wss=64MiB,requests=20000";

#[test]
fn shard_count_shows_in_json_and_text() {
    let base = ["sim", "--workload", W, "--cache-size", "16MiB", "-q"];
    let one: serde_json::Value =
        serde_json::from_str(&ok(&[&base[..], &["--json"]].concat())).unwrap();
    assert_eq!(one["shards"], 1, "the simulator's default is one shard");
    assert!(one.get("sharding").is_none());
    let four: serde_json::Value =
        serde_json::from_str(&ok(&[&base[..], &["--json", "--shards", "4"]].concat())).unwrap();
    assert_eq!(four["shards"], 4);
    // 4096 lines over 4 shards: 64 granules of 16 lines each.
    assert_eq!(four["sharding"]["granule_bytes"], 64 << 10);
    assert_eq!(four["sharding"]["requested_shards"], 4);
    assert_eq!(four["requests"], one["requests"]);
    assert_eq!(four["capacity_lines"], one["capacity_lines"]);
    let text = ok(&[&base[..], &["--shards", "4"]].concat());
    assert!(text.contains("shards       4 (granule 64 KiB;"), "{text}");
    // A cache of 16 lines cannot give 8 shards 64 lines each: it runs one, and says so.
    let tiny = [
        "sim",
        "--workload",
        W,
        "--cache-size",
        "64KiB",
        "-q",
        "--shards",
        "8",
    ];
    let j: serde_json::Value =
        serde_json::from_str(&ok(&[&tiny[..], &["--json"]].concat())).unwrap();
    assert_eq!(
        (&j["shards"], &j["sharding"]["requested_shards"]),
        (&1.into(), &8.into())
    );
    let text = ok(&tiny);
    assert!(text.contains("shards       1 of 8 asked"), "{text}");
    // A fixed granule fixes the shard count.
    let fixed = ok(&[&base[..], &["--shards", "4", "--shard-granule", "1MiB"]].concat());
    assert!(fixed.contains("shards       4 (granule 1 MiB;"), "{fixed}");
    let help = ok(&["sim", "--help"]);
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(help.contains("--shards <N>") && help.contains("Default 1 in the simulator"));
}

#[test]
fn sharding_is_refused_where_it_does_not_run() {
    let base = [
        "sim",
        "--workload",
        W,
        "--cache-size",
        "16MiB",
        "-q",
        "--shards",
        "2",
    ];
    for (extra, says) in [
        (&["--hdd", "7200", "--ssd", "default"][..], "a timed run"),
        (&["--layout", "log"][..], "the log layout"),
        (&["--ram-cache", "4MiB"][..], "--ram-cache"),
    ] {
        let o = run(&[&base[..], extra].concat());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{extra:?} ran");
        assert!(
            err.contains("--shards 2") && err.contains(says),
            "{extra:?}: {err}"
        );
    }
    let o = run(&[
        "sim",
        "--workload",
        W,
        "--cache-size",
        "16MiB",
        "--shards",
        "0",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--shards"));
}
