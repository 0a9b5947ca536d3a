//! ironwire: one daemon that exports block devices over NVMe/TCP, NVMe/RDMA
//! (iWARP) and iSCSI.

mod admit;
mod alloc;
mod bench;
mod config;
mod conn;
mod control;
mod cpu;
mod import;
mod iscsi_tcp;
mod nvme;
mod serve;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "ironwire",
    version,
    about = "A user-space storage target: block devices over NVMe/TCP, NVMe/RDMA (iWARP) and iSCSI"
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
        /// Control socket for `ironwire ctl` (overrides `[control] socket`;
        /// default /run/ironwire/ctl.sock as root,
        /// $XDG_RUNTIME_DIR/ironwire/ctl.sock otherwise).
        #[arg(long)]
        ctl_socket: Option<PathBuf>,
    },
    /// Edit or inspect a running daemon: show | stats | device-add NAME
    /// KIND [size=S] [block_size=N] [path=P] | ns-add NQN NSID DEVICE |
    /// ns-remove NQN NSID
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
    /// Print the ironwire configuration equivalent to a saved nvmetcli or
    /// targetcli configuration; what has no equivalent is named on stderr.
    Import {
        /// The tool that wrote FILE.
        #[arg(value_enum)]
        format: import::Format,
        /// `nvmetcli save` output, or targetcli's /etc/target/saveconfig.json.
        file: PathBuf,
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
        Command::Serve { config, cores, ctl_socket } => {
            let mut cfg = match config {
                Some(p) => load(&p)?,
                None => config::Config::embedded_default(),
            };
            if !cores.is_empty() {
                config::check_cores(&cores).context("--cores")?;
                cfg.reactor.cores = cores;
            }
            let ctl_socket = match ctl_socket.or_else(|| cfg.control.socket.clone()) {
                Some(s) => s,
                None => control::default_socket()?,
            };
            serve::run(cfg, &ctl_socket)
        }
        Command::Import { format, file } => {
            let imported = import::import(format, &file)?;
            print!("{}", imported.toml);
            for n in &imported.notes {
                eprintln!("ironwire import: {n}");
            }
            config::Config::parse(&imported.toml)
                .context("the imported configuration does not pass check-config here")?;
            Ok(())
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
