//! ironwire: one daemon that exports block devices over NVMe/TCP.

mod admit;
mod alloc;
mod bench;
mod config;
mod conn;
mod control;
mod cpu;
mod edit;
mod iscsi_tcp;
mod lifecycle;
mod listen;
mod metrics;
mod nvme;
mod runtime;
mod serve;
mod stats;
mod visibility;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "ironwire", version, about = "A user-space storage target: block devices over NVMe/TCP")]
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
        /// Control socket for `ironwire ctl` (overrides `[control] socket`;
        /// default /run/ironwire/ctl.sock as root,
        /// $XDG_RUNTIME_DIR/ironwire/ctl.sock otherwise).
        #[arg(long)]
        ctl_socket: Option<PathBuf>,
        /// Rewrite the --config file (atomically) after every change made
        /// with `ironwire ctl`, so that a restart keeps it.
        #[arg(long, requires = "config")]
        persist: bool,
    },
    /// Edit or inspect a running daemon (docs/ctl.md): show [--json] |
    /// save [FILE] | reload | stats | add|set|remove OBJECT key=value...
    /// (OBJECT: device, subsystem, namespace, host, port, target, lun,
    /// initiator, acl, discovery_chap)
    Ctl {
        /// Control socket of the daemon (default /run/ironwire/ctl.sock as
        /// root, $XDG_RUNTIME_DIR/ironwire/ctl.sock otherwise).
        #[arg(long)]
        socket: Option<PathBuf>,
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true)]
        command: Vec<String>,
    },
    /// Measure a target (or the local device, or the bare network path)
    /// the way fio does; see docs/bench.md.
    Bench {
        #[command(subcommand)]
        command: bench::BenchCommand,
    },
    /// Validate a configuration file and print what it defines.
    CheckConfig {
        /// TOML configuration file.
        config: PathBuf,
    },
}

fn load(path: &std::path::Path) -> Result<config::Config> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    config::Config::parse(&text).with_context(|| format!("in {}", path.display()))
}

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

fn main() -> std::process::ExitCode {
    match real_main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ironwire: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn real_main() -> Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_millis()
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Ctl { socket, command } => {
            let socket = match socket {
                Some(s) => s,
                None => control::default_socket()?,
            };
            control::client(&socket, &command)
        }
        Command::Bench { command } => bench::main(command),
        Command::Serve { config, cores, ctl_socket, persist } => {
            let mut cfg = match &config {
                Some(p) => load(p)?,
                None => config::Config::embedded_default(),
            };
            if !cores.is_empty() {
                config::check_cores(&cores).context("--cores")?;
                cfg.reactor.cores = cores.clone();
            }
            let ctl_socket = match ctl_socket.or_else(|| cfg.control.socket.clone()) {
                Some(s) => s,
                None => control::default_socket()?,
            };
            serve::run(cfg, &ctl_socket, serve::Origin { path: config, persist, cores })
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
