//! `tiercache ext4-classify` on an ext4 image made with mkfs.ext4 -d (skipped without e2fsprogs).

use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tiercache"))
}

#[test]
fn ext4_classify_counts_blocks_per_class() {
    if Command::new("mkfs.ext4").arg("-V").output().is_err() {
        tiercache_testskip::skip!(
            "mkfs.ext4 not found (apt-get install e2fsprogs); ext4-classify not run"
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(src.join("dir")).unwrap();
    std::fs::write(src.join("dir/small"), vec![7u8; 3000]).unwrap();
    std::fs::write(src.join("big"), vec![9u8; 5 << 20]).unwrap();
    let img = tmp.path().join("fs.img");
    let st = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", "4096", "-d"])
        .arg(&src)
        .arg(&img)
        .arg("64M")
        .status()
        .unwrap();
    assert!(st.success());
    for extra in [&[][..], &["--observe-all"][..]] {
        let o = bin()
            .arg("ext4-classify")
            .arg(&img)
            .args(extra)
            .arg("--json")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let c = &v["classes"];
        assert_eq!(v["blocks"], 16384);
        assert_eq!(c["file<4KiB"], 1, "{v}");
        assert_eq!(c["file<16MiB"], 1280, "{v}");
        assert_eq!(c["journal"], 1024, "{v}");
        assert!(c["directory"].as_u64().unwrap() >= 3, "{v}");
        assert!(c["metadata"].as_u64().unwrap() > 1000, "{v}");
    }
    // Not ext4: a clear error naming the file.
    let o = bin()
        .arg("ext4-classify")
        .arg(src.join("big"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("no ext4 superblock") && err.contains("big"),
        "{err}"
    );
}
