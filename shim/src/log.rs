//! Logging like NCCL's, under NCCL's own variables: `NCCL_DEBUG` (VERSION, WARN, INFO, TRACE)
//! and `NCCL_DEBUG_FILE` (`%h` host, `%p` pid). Lines are shaped like NCCL's
//! (`[date time] host:pid:tid [dev] NCCL WARN ...`) with `[ncclshim]` where NCCL puts the device.
//! Only set-up and error paths log; nothing here is on a forwarded call's path.

use std::fmt;
use std::io::Write;
use std::sync::{Mutex, OnceLock};

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Level {
    None,
    Version,
    Warn,
    Info,
}

impl Level {
    fn from_setting(value: Option<&str>) -> Level {
        match value.map(str::to_ascii_uppercase).as_deref() {
            Some("VERSION") => Level::Version,
            Some("WARN") => Level::Warn,
            Some("INFO") | Some("TRACE") | Some("ABORT") => Level::Info,
            _ => Level::None,
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Level::Warn => "WARN",
            _ => "INFO",
        }
    }
}

struct Logger {
    level: Level,
    host: String,
    sink: Mutex<Box<dyn Write + Send>>,
}

static LOGGER: OnceLock<Logger> = OnceLock::new();

fn logger() -> &'static Logger {
    LOGGER.get_or_init(|| {
        let level = Level::from_setting(std::env::var("NCCL_DEBUG").ok().as_deref());
        let host = host_name();
        let file = std::env::var("NCCL_DEBUG_FILE")
            .ok()
            .filter(|f| !f.is_empty());
        // Appended to: the real NCCL writes the same file.
        let opened = file.map(|f| debug_file_name(&f, &host)).and_then(|name| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(name)
                .ok()
        });
        let sink: Box<dyn Write + Send> = match opened {
            Some(f) => Box::new(f),
            None => Box::new(std::io::stdout()),
        };
        Logger {
            level,
            host,
            sink: Mutex::new(sink),
        }
    })
}

/// NCCL's expansion of `NCCL_DEBUG_FILE`: `%h` is the host name, `%p` the process id.
fn debug_file_name(pattern: &str, host: &str) -> String {
    pattern
        .replace("%h", host)
        .replace("%p", &std::process::id().to_string())
}

fn host_name() -> String {
    let full =
        std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "localhost".into());
    full.trim()
        .split('.')
        .next()
        .unwrap_or("localhost")
        .to_string()
}

fn thread_id() -> String {
    std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "?".into())
}

/// `2026-11-21 06:55:06` (UTC), the shape of NCCL's default timestamps.
fn timestamp(now: std::time::SystemTime) -> String {
    let secs = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

pub fn enabled(level: Level) -> bool {
    level <= logger().level && logger().level != Level::None
}

/// Writes one line at `level` if `NCCL_DEBUG` asks for it, or regardless when `always`.
pub fn write(level: Level, always: bool, message: fmt::Arguments) {
    if !(always || enabled(level)) {
        return;
    }
    let l = logger();
    let line = format!(
        "[{}] {}:{}:{} [ncclshim] NCCL {} {}\n",
        timestamp(std::time::SystemTime::now()),
        l.host,
        std::process::id(),
        thread_id(),
        level.tag(),
        message
    );
    if let Ok(mut sink) = l.sink.lock() {
        let _ = sink.write_all(line.as_bytes());
        let _ = sink.flush();
    }
}

macro_rules! log_warn {
    ($($arg:tt)*) => { $crate::log::write($crate::log::Level::Warn, false, format_args!($($arg)*)) };
}
macro_rules! log_info {
    ($($arg:tt)*) => { $crate::log::write($crate::log::Level::Info, false, format_args!($($arg)*)) };
}
/// A warning shown even without `NCCL_DEBUG`: for what leaves the library unable to work.
macro_rules! log_warn_always {
    ($($arg:tt)*) => { $crate::log::write($crate::log::Level::Warn, true, format_args!($($arg)*)) };
}
pub(crate) use {log_info, log_warn, log_warn_always};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_follow_nccl_debug() {
        assert_eq!(Level::from_setting(None), Level::None);
        assert_eq!(Level::from_setting(Some("warn")), Level::Warn);
        assert_eq!(Level::from_setting(Some("INFO")), Level::Info);
        assert_eq!(Level::from_setting(Some("VERSION")), Level::Version);
        assert_eq!(Level::from_setting(Some("bogus")), Level::None);
        assert!(Level::Warn < Level::Info);
    }

    #[test]
    fn timestamps_read_like_nccls() {
        let at = |secs| timestamp(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs));
        assert_eq!(at(0), "1970-01-01 00:00:00");
        assert_eq!(at(951_782_400), "2000-02-29 00:00:00");
        assert_eq!(at(1_795_244_106), "2026-11-21 06:55:06");
    }

    #[test]
    fn debug_file_names_expand_like_nccls() {
        let name = debug_file_name("/tmp/nccl.%h.%p.log", "node7");
        assert_eq!(name, format!("/tmp/nccl.node7.{}.log", std::process::id()));
    }
}
