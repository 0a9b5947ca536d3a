//! ironwire: one daemon that exports block devices over NVMe/TCP.

mod config;
mod nvme_tcp;
mod serve;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "ironwire",
    version,
    about = "A user-space storage target: block devices over NVMe/TCP"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the target (the embedded default when no --config is given).
    Serve {
        /// TOML configuration file.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// CPUs to run reactors on, e.g. "0" or "0,1" (overrides the config).
        #[arg(long, value_delimiter = ',')]
        cores: Vec<usize>,
    },
    /// Validate a configuration file and print what it defines.
    CheckConfig {
        /// TOML configuration file.
        config: PathBuf,
    },
}

fn load(path: &std::path::Path) -> Result<config::Config> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    config::Config::parse(&text).with_context(|| format!("in {}", path.display()))
}

fn main() -> Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_millis()
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve { config, cores } => {
            let mut cfg = match config {
                Some(p) => load(&p)?,
                None => config::Config::embedded_default(),
            };
            if !cores.is_empty() {
                cfg.reactor.cores = cores;
            }
            serve::run(cfg)
        }
        Command::CheckConfig { config } => {
            let cfg = load(&config)?;
            println!(
                "{}: {} devices, {} subsystems, {} ports: OK",
                config.display(),
                cfg.device.len(),
                cfg.subsystem.len(),
                cfg.port.len()
            );
            Ok(())
        }
    }
}
