//! Any text as an experiment file: a parse error, or a configuration that resolves to an
//! engine configuration or a clear error, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(exp) = toml::from_str::<tiercache_sim::Experiment>(text) {
        if let Ok((_, cfg)) = exp.cache.resolve(1) {
            let _ = tiercache_engine::Engine::new(cfg);
        }
        let _ = exp.input.to_input();
    }
});
