//! The engine's default chunk-rewrite crossover is the 7200 rpm model's, not a magic number.

use tiercache_devices::{rewrite_min_runs, HddConfig};
use tiercache_engine::{DEFAULT_REWRITE_CHUNK, DEFAULT_REWRITE_MIN_RUNS};

#[test]
fn default_crossover_is_the_7200_models() {
    let model = rewrite_min_runs(&HddConfig::default(), DEFAULT_REWRITE_CHUNK, 4096);
    assert_eq!(
        DEFAULT_REWRITE_MIN_RUNS, model,
        "update DEFAULT_REWRITE_MIN_RUNS to the model's crossover"
    );
}
