//! ironwire: one daemon that exports block devices over NVMe/TCP, NVMe/RDMA
//! (iWARP) and iSCSI.

mod admit;
mod alloc;
mod bench;
mod config;
mod conn;
mod control;
mod cpu;
mod edit;
mod fused;
mod import;
mod iscsi_session;
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

/// The version and the git revision it was built from.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (git ", env!("IRONWIRE_GIT_REV"), ")");

/// Where `serve` looks for its configuration when given no `--config`.
const DEFAULT_CONFIG: &str = "/etc/ironwire/ironwire.toml";

#[derive(Parser)]
#[command(
    name = "ironwire",
    version = VERSION,
    about = "A user-space storage target: block devices over NVMe/TCP, NVMe/RDMA (iWARP) and iSCSI"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the target (with no --config: /etc/ironwire/ironwire.toml when it
    /// exists, else the embedded default).
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
    /// save [FILE] | reload | stats [--json] | hosts [--json] | sessions
    /// [--json] | disconnect key=value... | add|set|remove OBJECT
    /// key=value... (OBJECT: device, subsystem, namespace, host, port,
    /// target, lun, initiator, acl, discovery_chap)
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
    /// Print the manual page (roff; `ironwire man | man -l -`), or write
    /// it and one page per subcommand into a directory.
    Man {
        /// Write ironwire.1 and ironwire-SUBCOMMAND.1 here instead, e.g.
        /// /usr/local/share/man/man1.
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
    /// Print the shell completion script for SHELL.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

fn load(path: &std::path::Path) -> Result<config::Config> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    config::Config::parse(&text).with_context(|| format!("in {}", path.display()))
}

/// The configuration file `serve` reads: `--config`'s, else `default`
/// when it exists, else none (the embedded default).
fn config_file(given: Option<PathBuf>, default: &std::path::Path) -> Option<PathBuf> {
    given.or_else(|| default.exists().then(|| default.to_path_buf()))
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
            // The file read is the one `ctl reload` and SIGHUP read again.
            let given = config.is_some();
            let config = config_file(config, std::path::Path::new(DEFAULT_CONFIG));
            let mut cfg = match &config {
                Some(p) => {
                    if !given {
                        eprintln!("ironwire: no --config: using {}", p.display());
                    }
                    load(p)?
                }
                None => {
                    eprintln!("ironwire: no --config and no {DEFAULT_CONFIG}: using the embedded default");
                    config::Config::embedded_default()
                }
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
        Command::Man { out_dir } => {
            let command = <Cli as clap::CommandFactory>::command();
            match out_dir {
                Some(dir) => std::fs::create_dir_all(&dir)
                    .and_then(|()| clap_mangen::generate_to(command, &dir))
                    .with_context(|| format!("writing manual pages into {}", dir.display())),
                None => Ok(clap_mangen::Man::new(command).render(&mut std::io::stdout())?),
            }
        }
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "ironwire", &mut std::io::stdout());
            Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Without `--config`, the default file `serve` reads is also the one
    /// reloads read again (it was "started without --config" to them).
    #[test]
    fn serve_without_config_reads_and_reloads_the_default_file_when_there_is_one() {
        let dir = std::env::temp_dir().join(format!("ironwire-default-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let default = dir.join("ironwire.toml");
        assert_eq!(config_file(None, &default), None, "no file: the embedded default");
        std::fs::write(&default, "").expect("write");
        assert_eq!(config_file(None, &default), Some(default.clone()));
        let given = dir.join("other.toml");
        assert_eq!(config_file(Some(given.clone()), &default), Some(given));
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
