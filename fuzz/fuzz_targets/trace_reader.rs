//! Any bytes, read as any trace format (the first byte picks it), with and without
//! skip-bad: never a panic, and every error names its place.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::io::Cursor;
use std::path::Path;
use tiercache_trace::{Format, ReadOptions, TraceReader};

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let format = Format::ALL[pick as usize % Format::ALL.len()];
    let opts = ReadOptions {
        skip_bad: pick & 0x80 != 0,
        ..Default::default()
    };
    let label = Path::new("fuzz.input");
    let reader =
        TraceReader::from_reader(label, format, Box::new(Cursor::new(rest.to_vec())), &opts);
    for item in reader.take(1 << 16) {
        if let Err(e) = item {
            assert!(e.to_string().starts_with("fuzz.input:"));
        }
    }
});
