//! CPU time accounting: this process (getrusage), another process or one of
//! our threads (`/proc/.../stat`), and the daemon's own figures as the
//! control socket's `stats` command reports them.

use std::time::Duration;

/// User and system CPU time of this process.
pub fn self_cpu() -> (Duration, Duration) {
    // SAFETY: rusage is plain data that getrusage fills in.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid pointer to `ru`.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return (Duration::ZERO, Duration::ZERO);
    }
    let tv = |t: libc::timeval| Duration::from_micros(t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64);
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime and stime (fields 14 and 15) of a `/proc/.../stat` line, in ticks.
pub fn parse_stat_ticks(stat: &str) -> Option<(u64, u64)> {
    // The command name (field 2) may hold spaces and parentheses: count
    // fields from the last ')'.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14 = index 11.
    Some((f.get(11)?.parse::<u64>().ok()?, f.get(12)?.parse::<u64>().ok()?))
}

/// User and system CPU time (utime, stime) of the process or thread whose
/// `stat` file is `path`.
pub fn proc_cpu_times(path: &str) -> Option<(Duration, Duration)> {
    let (utime, stime) = parse_stat_ticks(&std::fs::read_to_string(path).ok()?)?;
    let time = |ticks: u64| Duration::from_secs_f64(ticks as f64 / clock_ticks());
    Some((time(utime), time(stime)))
}

/// utime + stime of the process or thread whose `stat` file is `path`.
pub fn proc_cpu(path: &str) -> Option<Duration> {
    proc_cpu_times(path).map(|(usr, sys)| usr + sys)
}

/// CPU time of each of this process's threads whose name starts with
/// `prefix`, by name, sorted.
pub fn threads_cpu(prefix: &str) -> Vec<(String, Duration)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    let mut out: Vec<(String, Duration)> = dir
        .flatten()
        .filter_map(|e| {
            let base = e.path();
            let name = std::fs::read_to_string(base.join("comm")).ok()?.trim().to_string();
            if !name.starts_with(prefix) {
                return None;
            }
            Some((name, proc_cpu(base.join("stat").to_str()?)?))
        })
        .collect();
    out.sort();
    out
}

/// The `cpu` line of the control socket's `stats` reply.
pub fn stats_line() -> String {
    let (usr, sys) = self_cpu();
    format!("cpu user_us={} system_us={}\n", usr.as_micros(), sys.as_micros())
}

/// The process CPU time (user + system) in a `stats` reply.
pub fn parse_stats_cpu(reply: &str) -> Option<Duration> {
    let line = reply.lines().find(|l| l.starts_with("cpu "))?;
    let mut total = 0u64;
    let mut seen = 0;
    for kv in line.split_whitespace().skip(1) {
        if let Some(("user_us" | "system_us", v)) = kv.split_once('=') {
            total += v.parse::<u64>().ok()?;
            seen += 1;
        }
    }
    (seen == 2).then(|| Duration::from_micros(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_ticks_skip_a_command_name_with_spaces() {
        let line = "1234 (my (odd) cmd) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0 100 0 0";
        assert_eq!(parse_stat_ticks(line), Some((250, 50)));
        assert_eq!(parse_stat_ticks("garbage"), None);
        assert!(proc_cpu("/proc/self/stat").is_some());
    }

    #[test]
    fn stats_reply_round_trips_the_process_cpu() {
        let reply = format!("{}thread reactor-0 cpu_us=5\n", stats_line());
        let cpu = parse_stats_cpu(&reply).expect("cpu line");
        let (u, s) = self_cpu();
        assert!(cpu <= u + s + Duration::from_millis(1));
        assert_eq!(parse_stats_cpu("cpu user_us=7 system_us=3\n"), Some(Duration::from_micros(10)));
        assert_eq!(parse_stats_cpu("cpu user_us=7\n"), None);
        assert_eq!(parse_stats_cpu("no such line\n"), None);
    }

    #[test]
    fn named_threads_are_found() {
        let h = std::thread::Builder::new()
            .name("cputest-1".into())
            .spawn(|| {
                let t = std::time::Instant::now();
                while t.elapsed() < Duration::from_millis(30) {
                    std::hint::spin_loop();
                }
                threads_cpu("cputest-")
            })
            .expect("spawn");
        let seen = h.join().expect("join");
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen[0].0, "cputest-1");
    }
}
