//! What the simulator's integration tests share.
#![allow(dead_code)] // each test file uses its own subset

use std::path::PathBuf;

/// `../shared/traces` beside the checkout, or `None` with a SKIP line when it is missing.
pub fn traces_dir() -> Option<PathBuf> {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
    if d.join("MANIFEST.md").is_file() {
        Some(d)
    } else {
        tiercache_testskip::skip!(
            "shared traces not found at {} (the tests need ../shared beside the checkout)",
            d.display()
        );
        None
    }
}
