//! The daemon's configuration parser and validator
//! (`crates/ironwire/src/config.rs`, compiled in here since it lives in the
//! binary crate).
//!
//! Input: the whole input as the TOML text when it is UTF-8 (other inputs
//! are skipped: a config file that is not UTF-8 never reaches the parser).
//!
//! Never panics; whatever `Config::parse` accepts validates again, and its
//! error (if any) names something.
#![no_main]

use libfuzzer_sys::fuzz_target;

// The module is the daemon's, unchanged; this target uses only its parser,
// so the rest (defaults for the daemon, name checks it calls itself) would
// be dead code here.
#[allow(dead_code)]
#[path = "../../crates/ironwire/src/config.rs"]
mod config;

fuzz_target!(
    init: {
        // Every refused config is an anyhow error, which captures a
        // backtrace when RUST_BACKTRACE is set (cargo fuzz sets it): 30
        // times slower. Panics still print theirs.
        std::env::set_var("RUST_LIB_BACKTRACE", "0");
    },
    |input: &[u8]| {
        let Ok(text) = std::str::from_utf8(input) else {
            return;
        };
        match config::Config::parse(text) {
            Ok(c) => {
                if let Err(e) = c.validate() {
                    panic!("a parsed config fails validation: {e:#}");
                }
            }
            Err(e) => assert!(!format!("{e:#}").is_empty()),
        }
    }
);
