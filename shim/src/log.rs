//! Logging like NCCL's, under NCCL's own variables (from the environment or NCCL's configuration
//! files, nccl_env.rs), read as the real NCCL's version reads them: `NCCL_DEBUG` (VERSION, WARN,
//! INFO, TRACE), `NCCL_DEBUG_FILE` (`%h` host, `%p` pid), `NCCL_DEBUG_TIMESTAMP_LEVELS`,
//! `NCCL_DEBUG_TIMESTAMP_FORMAT`, `NCCL_WARN_ENABLE_DEBUG_INFO` (INFO from the first warning
//! on), and, for the lines of calls only, `NCCL_DEBUG_SUBSYS`. Lines are shaped like NCCL's
//! (`[date time] host:pid:tid [dev] NCCL WARN ...`, the local time on warnings only unless
//! `NCCL_DEBUG_TIMESTAMP_LEVELS` says otherwise) with `[ncclshim]` where NCCL puts the device.
//! Set-up and error paths log, and (COLL) the calls the core takes; nothing here is on a
//! forwarded call's path.
//!
//! `NCCL_DEBUG_FILE` is shared with the real NCCL, which opens it at its first log line of any
//! level (`fopen(name, "w")`: it empties the file, then writes at its own offset), before or after
//! ours. We append (`O_APPEND`), and before each line of ours we look for the real NCCL's
//! descriptor of the file: once it is there, it is made to append too, so that neither writes
//! over the other, and the lines of ours that its opening emptied away are written again (at our
//! next line, or when the process exits).

use std::ffi::c_int;
use std::fmt;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::nccl_env;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Level {
    None,
    Version,
    Warn,
    Info,
}

impl Level {
    /// `NCCL_DEBUG` as NCCL reads it; `strict` (`nccl_env::parsed`): trimmed of spaces.
    fn from_setting(value: Option<&str>, strict: bool) -> Level {
        let value = value.map(|v| if strict { v.trim() } else { v });
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

    fn from_u8(value: u8) -> Level {
        [Level::None, Level::Version, Level::Warn, Level::Info][usize::from(value.min(3))]
    }
}

struct Logger {
    /// `NCCL_DEBUG` (a `Level`), raised to INFO after a warning where
    /// `NCCL_WARN_ENABLE_DEBUG_INFO` asks.
    level: AtomicU8,
    /// `NCCL_WARN_ENABLE_DEBUG_INFO`.
    warning_raises_level: bool,
    /// The levels whose lines start with the time (`NCCL_DEBUG_TIMESTAMP_LEVELS`; unset, WARN).
    timestamped: [bool; 2],
    /// `NCCL_DEBUG_TIMESTAMP_FORMAT`, or NCCL's default.
    timestamp_format: String,
    host: String,
    /// `NCCL_DEBUG_FILE` as set, to name the file again in a forked child.
    file_pattern: Option<String>,
    sink: Mutex<Sink>,
}

enum Sink {
    Stdout,
    File(DebugFile),
}

static LOGGER: OnceLock<Logger> = OnceLock::new();

fn logger() -> &'static Logger {
    LOGGER.get_or_init(|| {
        let strict = nccl_env::parsed();
        let level = Level::from_setting(nccl_env::get("NCCL_DEBUG").as_deref(), strict);
        let stamped = nccl_env::get("NCCL_DEBUG_TIMESTAMP_LEVELS");
        let timestamped = [Level::Warn, Level::Info]
            .map(|level| takes(stamped.as_deref(), level.tag(), &LEVELS, &["WARN"], strict));
        let raise = nccl_env::get("NCCL_WARN_ENABLE_DEBUG_INFO");
        let timestamp_format = nccl_env::get("NCCL_DEBUG_TIMESTAMP_FORMAT")
            .unwrap_or_else(|| TIMESTAMP_FORMAT.to_string());
        let host = host_name();
        let file_pattern = nccl_env::get("NCCL_DEBUG_FILE").filter(|f| !f.is_empty());
        let opened = file_pattern
            .as_deref()
            .and_then(|pattern| DebugFile::open_for_process(pattern, &host, level));
        let sink = match opened {
            Some(file) => Sink::File(file),
            None => Sink::Stdout,
        };
        Logger {
            level: AtomicU8::new(level as u8),
            warning_raises_level: warning_raises_level(raise.as_deref(), nccl_env::version()),
            timestamped,
            timestamp_format,
            host,
            file_pattern,
            sink: Mutex::new(sink),
        }
    })
}

/// At exit, writes again the lines of ours that the real NCCL's opening of the file emptied away
/// after our last line (nothing where we never logged to a file).
#[ctor::dtor]
fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(logger) = LOGGER.get()
            && let Ok(mut sink) = logger.sink.lock()
            && let Sink::File(file) = &mut *sink
        {
            file.share_with_nccl();
        }
    });
}

unsafe extern "C" {
    fn fcntl(fd: c_int, command: c_int, ...) -> c_int;
}
const F_GETFL: c_int = 3;
const F_SETFL: c_int = 4;
const O_ACCMODE: c_int = 0o3;
const O_RDONLY: c_int = 0;
const O_APPEND: c_int = 0o2000;

/// Adds `flags` (e.g. O_NONBLOCK) to a descriptor's status flags.
///
/// # Safety
/// `fd` is an open descriptor of this process.
pub(crate) unsafe fn set_flags(fd: c_int, flags: c_int) {
    // SAFETY: F_GETFL and F_SETFL on the caller's descriptor.
    unsafe {
        let old = fcntl(fd, F_GETFL);
        if old >= 0 {
            fcntl(fd, F_SETFL, old | flags);
        }
    }
}

/// Most bytes of ours kept to be written again (about a hundred lines; we write a few).
const KEPT_BYTES: usize = 64 << 10;

/// `NCCL_DEBUG_FILE`, opened by us to append, and shared with the real NCCL.
struct DebugFile {
    file: File,
    /// The process it was named for (`%p`): a forked child opens its own, as the real NCCL does.
    pid: u32,
    /// Whether the real NCCL opens the file too (it does where `NCCL_DEBUG` is above VERSION).
    shared: bool,
    /// Whether the real NCCL's descriptor of the file has been found (and made to append).
    nccl_has_it: bool,
    /// Our lines written before the real NCCL opened the file: its opening empties it.
    before_nccl: Vec<u8>,
}

impl DebugFile {
    /// The file `pattern` names for this process; `None` where it cannot be opened.
    fn open_for_process(pattern: &str, host: &str, level: Level) -> Option<DebugFile> {
        let pid = std::process::id();
        let name = debug_file_name(pattern, host, pid);
        // The real NCCL opens the file only where it logs more than its version.
        let shared = level > Level::Version;
        DebugFile::open(Path::new(&name), pid, shared).ok()
    }

    fn open(path: &Path, pid: u32, shared: bool) -> std::io::Result<DebugFile> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(DebugFile {
            file,
            pid,
            shared,
            nccl_has_it: false,
            before_nccl: Vec::new(),
        })
    }

    fn write_line(&mut self, line: &[u8]) {
        self.share_with_nccl();
        // One write per line: with O_APPEND, the kernel puts each at the end as a whole.
        let _ = self.file.write_all(line);
        if self.shared && !self.nccl_has_it && self.before_nccl.len() + line.len() <= KEPT_BYTES {
            self.before_nccl.extend_from_slice(line);
        }
    }

    /// Once the real NCCL has opened the file: makes its descriptor append, and writes again
    /// our lines from before, which its opening emptied away.
    fn share_with_nccl(&mut self) {
        if !self.shared || self.nccl_has_it {
            return;
        }
        let others = other_writers(&self.file);
        if others.is_empty() {
            return;
        }
        for fd in others {
            // SAFETY: F_GETFL and F_SETFL on a descriptor of this process; only O_APPEND changes.
            unsafe {
                let flags = fcntl(fd, F_GETFL);
                if flags >= 0 && flags & O_APPEND == 0 {
                    fcntl(fd, F_SETFL, flags | O_APPEND);
                }
            }
        }
        self.nccl_has_it = true;
        let before = std::mem::take(&mut self.before_nccl);
        if !before.is_empty() {
            let _ = self.file.write_all(&before);
        }
    }
}

/// The other descriptors of this process open for writing on the same file as `file` (the real
/// NCCL's, once it has opened it).
fn other_writers(file: &File) -> Vec<c_int> {
    let (Ok(ours), Ok(entries)) = (file.metadata(), std::fs::read_dir("/proc/self/fd")) else {
        return Vec::new();
    };
    let own = file.as_raw_fd();
    entries
        .flatten()
        .filter_map(|entry| {
            let fd: c_int = entry.file_name().to_str()?.parse().ok()?;
            let target = std::fs::metadata(entry.path()).ok()?;
            let same = fd != own && target.dev() == ours.dev() && target.ino() == ours.ino();
            // SAFETY: F_GETFL reads a descriptor's flags; an fd closed meanwhile gives -1.
            let flags = if same {
                unsafe { fcntl(fd, F_GETFL) }
            } else {
                -1
            };
            (flags >= 0 && flags & O_ACCMODE != O_RDONLY).then_some(fd)
        })
        .collect()
}

/// NCCL's expansion of `NCCL_DEBUG_FILE`: `%h` is the host name, `%p` the process id, `%%` a
/// `%`; any other `%x` stays as it is.
pub(crate) fn debug_file_name(pattern: &str, host: &str, pid: u32) -> String {
    let mut name = String::with_capacity(pattern.len() + host.len());
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            name.push(c);
            continue;
        }
        match chars.next() {
            Some('%') => name.push('%'),
            Some('h') => name.push_str(host),
            Some('p') => name.push_str(&pid.to_string()),
            Some(other) => {
                name.push('%');
                name.push(other);
            }
            None => name.push('%'),
        }
    }
    name
}

/// The host name as NCCL's log lines and file names have it: up to the first `.`, with `%` and
/// `/` made `-`.
pub(crate) fn host_name() -> String {
    let full =
        std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "localhost".into());
    log_host_name(full.trim())
}

fn log_host_name(full: &str) -> String {
    full.split('.')
        .next()
        .unwrap_or("localhost")
        .replace(['%', '/'], "-")
}

/// This thread's id, as NCCL's lines give it: read once a thread (the lines of calls come one
/// a call), again in a forked child.
fn thread_id() -> u32 {
    thread_local! {
        /// (process, thread) as last read.
        static IDS: std::cell::Cell<(u32, u32)> = const { std::cell::Cell::new((0, 0)) };
    }
    let pid = std::process::id();
    IDS.with(|ids| {
        let (read_in, tid) = ids.get();
        if read_in == pid {
            return tid;
        }
        let tid = std::fs::read_link("/proc/thread-self")
            .ok()
            .and_then(|p| p.file_name()?.to_str()?.parse().ok())
            .unwrap_or(0);
        ids.set((pid, tid));
        tid
    })
}

/// NCCL's default `NCCL_DEBUG_TIMESTAMP_FORMAT`: `[2026-11-21 06:55:06] `.
const TIMESTAMP_FORMAT: &str = "[%F %T] ";

/// glibc's `struct tm` (56 bytes on 64-bit Linux), held whole: only libc reads and writes it.
#[repr(C, align(8))]
struct Tm([u8; 64]);

unsafe extern "C" {
    fn localtime_r(time: *const i64, tm: *mut Tm) -> *mut Tm;
    fn strftime(
        out: *mut std::ffi::c_char,
        max: usize,
        format: *const std::ffi::c_char,
        tm: *const Tm,
    ) -> usize;
}

/// The time `now` as NCCL stamps its lines (debug.cc): local time through `strftime` with
/// `format` (`NCCL_DEBUG_TIMESTAMP_FORMAT`), whose first `%Nf` (N a digit from 1 to 9) is the
/// fraction of the second in N digits; empty where the format gives nothing.
fn timestamp(format: &str, now: std::time::SystemTime) -> String {
    let since = now
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let format = with_subseconds(format, since.subsec_nanos());
    let Ok(format) = std::ffi::CString::new(format) else {
        return String::new();
    };
    let secs = since.as_secs() as i64;
    let mut tm = Tm([0; 64]);
    let mut out = [0u8; 256];
    // SAFETY: localtime_r writes the `struct tm` it is given, which `tm` holds whole; strftime
    // writes at most `out.len()` bytes, and says how many (0: none fitted).
    let written = unsafe {
        if localtime_r(&secs, &mut tm).is_null() {
            return String::new();
        }
        strftime(out.as_mut_ptr().cast(), out.len(), format.as_ptr(), &tm)
    };
    String::from_utf8_lossy(&out[..written]).into_owned()
}

/// `format` with its first `%Nf` (`%%` passed over) replaced by the first N digits of the
/// fraction of a second `nanos` makes, as NCCL does before `strftime`.
fn with_subseconds(format: &str, nanos: u32) -> String {
    let bytes = format.as_bytes();
    let mut i = 0;
    while i + 1 < bytes.len() {
        if bytes[i] == b'%' && bytes[i + 1] == b'%' {
            i += 2;
            continue;
        }
        if bytes[i] == b'%'
            && bytes.get(i + 2) == Some(&b'f')
            && (b'1'..=b'9').contains(&bytes[i + 1])
        {
            let digits = usize::from(bytes[i + 1] - b'0');
            let fraction = format!("{nanos:09}");
            return format!(
                "{}{}{}",
                &format[..i],
                &fraction[..digits],
                &format[i + 3..]
            );
        }
        i += 1;
    }
    format.to_string()
}

pub fn enabled(level: Level) -> bool {
    let set = logger().level();
    level <= set && set != Level::None
}

impl Logger {
    fn level(&self) -> Level {
        Level::from_u8(self.level.load(Ordering::Relaxed))
    }
}

/// Whether `NCCL_WARN_ENABLE_DEBUG_INFO` (`value`) has the log go on at INFO after a warning,
/// as the real NCCL of `version` reads it: from 2.19.4, an integer not 0 (`strtoll`); from
/// 2.30.7, `1`, `T` or `TRUE` (any case). An unknown version reads as the newest.
fn warning_raises_level(value: Option<&str>, version: Option<i32>) -> bool {
    let (Some(value), version) = (value, version.unwrap_or(i32::MAX)) else {
        return false;
    };
    if version >= nccl_env::PARAM_PARSERS {
        ["1", "T", "TRUE"]
            .iter()
            .any(|t| t.eq_ignore_ascii_case(value))
    } else {
        version >= WARNING_RAISES_LEVEL && nccl_env::c_integer(value).is_some_and(|v| v != 0)
    }
}

/// The first NCCL that reads `NCCL_WARN_ENABLE_DEBUG_INFO`.
const WARNING_RAISES_LEVEL: i32 = 21904;

/// Whether NCCL logs a line for each collective call: `NCCL_DEBUG` at INFO or TRACE and
/// `NCCL_DEBUG_SUBSYS` taking COLL, read as the real NCCL reads it. Asked first by the core's
/// calls, once the real NCCL is loaded.
pub fn collectives_logged() -> bool {
    static COLLECTIVES: OnceLock<bool> = OnceLock::new();
    // Two loads a call once read: the core asks at each call it takes or answers.
    let taken = *COLLECTIVES.get_or_init(|| {
        let value = nccl_env::get("NCCL_DEBUG_SUBSYS");
        takes(
            value.as_deref(),
            "COLL",
            &SUBSYSTEMS,
            &UNSET_SUBSYSTEMS,
            nccl_env::parsed(),
        )
    });
    taken && enabled(Level::Info)
}

/// The levels `NCCL_DEBUG_TIMESTAMP_LEVELS` names.
const LEVELS: [&str; 6] = ["VERSION", "WARN", "INFO", "ABORT", "TRACE", "ALL"];

/// The subsystems NCCL logs where `NCCL_DEBUG_SUBSYS` is unset.
const UNSET_SUBSYSTEMS: [&str; 3] = ["INIT", "BOOTSTRAP", "ENV"];

/// The subsystems NCCL 2.30.7 knows, for `NCCL_DEBUG_SUBSYS`.
const SUBSYSTEMS: [&str; 19] = [
    "INIT",
    "COLL",
    "P2P",
    "SHM",
    "NET",
    "GRAPH",
    "TUNING",
    "ENV",
    "ALLOC",
    "ALLOC_HOST",
    "CALL",
    "PROXY",
    "NVLS",
    "BOOTSTRAP",
    "REG",
    "PROFILE",
    "RAS",
    "DESTROY",
    "ALL",
];

/// Whether a list setting of NCCL's debug log (`value`) names `name`, as NCCL before 2.30.7
/// reads them (debug.cc): names split at commas, any case, ALL for every one, a leading `^` for
/// every one but those named; unset, `unset` names them.
fn list_takes(value: Option<&str>, name: &str, unset: &[&str]) -> bool {
    let Some(value) = value else {
        return unset.contains(&name);
    };
    let (invert, names) = inverted(value);
    names.split(',').any(|n| names_it(n, name)) != invert
}

/// A list setting's leading `^` (every name but those listed), and the list.
fn inverted(value: &str) -> (bool, &str) {
    match value.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, value),
    }
}

/// Whether the listed `entry` names `name` (ALL names every one).
fn names_it(entry: &str, name: &str) -> bool {
    entry.eq_ignore_ascii_case(name) || entry.eq_ignore_ascii_case("ALL")
}

/// Whether a list setting of NCCL's debug log (`value`), whose names are `known`, takes `name`
/// (unset: `unset` names them); `strict`, as NCCL 2.30.7 and later read them (`nccl_env::parsed`):
/// names trimmed, and a value that names one NCCL does not know refused whole, for the default.
fn takes(value: Option<&str>, name: &str, known: &[&str], unset: &[&str], strict: bool) -> bool {
    let Some(value) = value.filter(|_| strict) else {
        return list_takes(value, name, unset);
    };
    let (invert, names) = inverted(value);
    let names: Vec<&str> = nccl_env::names_of(names, true).collect();
    let is_known = |n: &&str| known.iter().any(|k| k.eq_ignore_ascii_case(n));
    if !names.iter().all(is_known) {
        return unset.contains(&name);
    }
    names.iter().any(|n| names_it(n, name)) != invert
}

/// Writes one line at `level` if `NCCL_DEBUG` asks for it, or regardless when `always`. A
/// message of several lines is written at once, with the prefix on its first.
pub fn write(level: Level, always: bool, message: fmt::Arguments) {
    if !(always || enabled(level)) {
        return;
    }
    let l = logger();
    // NCCL goes on at INFO after a warning it wrote, where asked (debug.cc).
    if level == Level::Warn && l.warning_raises_level && enabled(Level::Warn) {
        l.level.store(Level::Info as u8, Ordering::Relaxed);
    }
    let stamp = match l.timestamped[usize::from(level != Level::Warn)] {
        true => timestamp(&l.timestamp_format, std::time::SystemTime::now()),
        false => String::new(),
    };
    let line = format!(
        "{stamp}{}:{}:{} [ncclshim] NCCL {} {}\n",
        l.host,
        std::process::id(),
        thread_id(),
        level.tag(),
        message
    );
    if let Ok(mut sink) = l.sink.lock() {
        match &mut *sink {
            Sink::File(file) => {
                // A forked child's lines go to its own file (`%p`), where its NCCL writes.
                if file.pid != std::process::id()
                    && let Some(pattern) = &l.file_pattern
                    && let Some(own) = DebugFile::open_for_process(pattern, &l.host, l.level())
                {
                    *file = own;
                }
                file.write_line(line.as_bytes())
            }
            Sink::Stdout => {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(line.as_bytes());
                let _ = out.flush();
            }
        }
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
        for strict in [false, true] {
            let level = |value| Level::from_setting(value, strict);
            assert_eq!(level(None), Level::None);
            assert_eq!(level(Some("warn")), Level::Warn);
            assert_eq!(level(Some("INFO")), Level::Info);
            assert_eq!(level(Some("VERSION")), Level::Version);
            assert_eq!(level(Some("bogus")), Level::None);
        }
        // From 2.30.7 the value is trimmed.
        assert_eq!(Level::from_setting(Some(" info "), false), Level::None);
        assert_eq!(Level::from_setting(Some(" info "), true), Level::Info);
        assert!(Level::Warn < Level::Info);
        for level in [Level::None, Level::Version, Level::Warn, Level::Info] {
            assert_eq!(Level::from_u8(level as u8), level);
        }
    }

    fn takes_subsystem(value: Option<&str>, name: &str, strict: bool) -> bool {
        takes(value, name, &SUBSYSTEMS, &UNSET_SUBSYSTEMS, strict)
    }

    #[test]
    fn subsystems_follow_nccl_debug_subsys() {
        let coll = |setting| takes_subsystem(setting, "COLL", false);
        assert!(!coll(None), "NCCL's default: INIT, BOOTSTRAP, ENV");
        assert!(takes_subsystem(None, "INIT", false));
        assert!(coll(Some("INIT,coll")));
        assert!(coll(Some("ALL")));
        assert!(!coll(Some("INIT,NET")));
        assert!(!coll(Some("COLLX")));
        assert!(coll(Some("^INIT")));
        assert!(!coll(Some("^INIT,COLL")));
        assert!(!coll(Some("^ALL")));
        assert!(!coll(Some("")));
        // Before 2.30.7: names as they are, unknown ones passed over.
        assert!(!coll(Some("INIT, COLL")));
        assert!(coll(Some("COLL,FOO")));
    }

    #[test]
    fn subsystems_follow_nccl_2_30_7s_stricter_reading() {
        let coll = |setting| takes_subsystem(setting, "COLL", true);
        assert!(!coll(None));
        assert!(coll(Some("INIT, coll ")));
        assert!(coll(Some("^ INIT")));
        assert!(!coll(Some("^INIT, COLL")));
        assert!(coll(Some("ALL")));
        assert!(!coll(Some("")));
        // A name NCCL does not know: the whole value refused, the default taken.
        assert!(!coll(Some("COLL,FOO")));
        assert!(takes_subsystem(Some("COLL,FOO"), "INIT", true));
        assert!(!coll(Some("^FOO")));
    }

    #[test]
    fn timestamp_levels_follow_nccl_debug_timestamp_levels() {
        for strict in [false, true] {
            let stamps = |value, level| takes(value, level, &LEVELS, &["WARN"], strict);
            assert!(stamps(None, "WARN") && !stamps(None, "INFO"));
            assert!(stamps(Some("info"), "INFO") && !stamps(Some("INFO"), "WARN"));
            assert!(stamps(Some("ALL"), "INFO"));
            assert!(!stamps(Some("^WARN"), "WARN") && stamps(Some("^WARN"), "INFO"));
        }
        // From 2.30.7, names trimmed, and a level NCCL does not know refuses the value whole.
        let stamps = |value, level, strict| takes(Some(value), level, &LEVELS, &["WARN"], strict);
        assert!(!stamps("WARN, INFO", "INFO", false) && stamps("WARN, INFO", "INFO", true));
        assert!(stamps("INFO,NOW", "INFO", false) && !stamps("INFO,NOW", "INFO", true));
        assert!(stamps("INFO,NOW", "WARN", true), "the default");
    }

    #[test]
    fn a_warning_raises_the_level_where_nccls_setting_asks() {
        let raises = |value, version| warning_raises_level(Some(value), version);
        assert!(!warning_raises_level(None, None));
        assert!(raises("1", Some(22809)) && raises("0x2", Some(22809)));
        assert!(!raises("0", Some(22809)) && !raises("yes", Some(22809)));
        assert!(!raises("1", Some(21903)), "2.19.3 does not read it");
        assert!(raises("1", Some(21904)));
        assert!(raises("true", Some(23007)) && raises("T", None));
        assert!(!raises("2", Some(23007)) && !raises(" 1", Some(23007)));
    }

    #[test]
    fn each_thread_says_its_own_id() {
        let here = thread_id();
        assert_eq!(thread_id(), here, "read once, the same after");
        let there = std::thread::spawn(thread_id).join().unwrap();
        assert!(here != 0 && there != 0 && there != here, "{here} {there}");
    }

    #[test]
    fn timestamps_read_like_nccls() {
        // Mid-month, at noon: the same month in every time zone.
        let at = |format: &str, nanos| {
            let when = std::time::Duration::new(961_070_400, nanos);
            timestamp(format, std::time::UNIX_EPOCH + when)
        };
        assert_eq!(at("[%Y-%m] ", 0), "[2000-06] ");
        assert_eq!(
            at(TIMESTAMP_FORMAT, 0).len(),
            "[2000-06-15 12:00:00] ".len()
        );
        assert!(at(TIMESTAMP_FORMAT, 0).starts_with("[2000-06-1"));
        assert_eq!(at("%Y.%3f 100%%", 123_456_789), "2000.123 100%");
        assert_eq!(at("%%3f %9f", 5), "%3f 000000005");
        assert_eq!(at("", 0), "");
    }

    #[test]
    fn debug_file_names_expand_like_nccls() {
        assert_eq!(
            debug_file_name("/logs/nccl.%h.%p.log", "node7", 4711),
            "/logs/nccl.node7.4711.log"
        );
        assert_eq!(
            debug_file_name("/logs/%%h-%x-%p%", "node7", 12),
            "/logs/%h-%x-12%"
        );
        assert_eq!(log_host_name("gpu-3.cluster.example"), "gpu-3");
        assert_eq!(log_host_name("odd%name/x"), "odd-name-x");
    }

    /// The real NCCL's way with the file: `fopen(name, "w")`, then a line per write.
    fn nccl_opens(path: &Path) -> File {
        File::create(path).unwrap()
    }

    fn lines_of(path: &Path) -> Vec<String> {
        let text = std::fs::read_to_string(path).unwrap();
        text.lines().map(str::to_string).collect()
    }

    #[test]
    fn lines_of_ours_survive_the_real_nccl_opening_the_file_after_them() {
        let scratch = crate::locate::Scratch::new("log-after");
        let path = scratch.0.join("nccl.log");
        let mut ours = DebugFile::open(&path, std::process::id(), true).unwrap();
        ours.write_line(b"shim 1\n");
        let mut nccl = nccl_opens(&path);
        nccl.write_all(b"nccl 1\n").unwrap();
        // Our next line finds NCCL's descriptor: ours from before come back, and from now on
        // both append.
        ours.write_line(b"shim 2\n");
        nccl.write_all(b"nccl 2\n").unwrap();
        ours.write_line(b"shim 3\n");
        assert_eq!(
            lines_of(&path),
            ["nccl 1", "shim 1", "shim 2", "nccl 2", "shim 3"]
        );
    }

    #[test]
    fn lines_of_ours_come_back_at_exit_when_none_follows() {
        let scratch = crate::locate::Scratch::new("log-exit");
        let path = scratch.0.join("nccl.log");
        let mut ours = DebugFile::open(&path, std::process::id(), true).unwrap();
        ours.write_line(b"shim 1\n");
        let mut nccl = nccl_opens(&path);
        nccl.write_all(b"nccl 1\n").unwrap();
        // What the handler run at exit does.
        ours.share_with_nccl();
        ours.share_with_nccl();
        assert_eq!(lines_of(&path), ["nccl 1", "shim 1"]);
    }

    #[test]
    fn a_file_the_real_nccl_opened_first_is_appended_to_by_both() {
        let scratch = crate::locate::Scratch::new("log-before");
        let path = scratch.0.join("nccl.log");
        let mut nccl = nccl_opens(&path);
        nccl.write_all(b"nccl 1\n").unwrap();
        let mut ours = DebugFile::open(&path, std::process::id(), true).unwrap();
        ours.write_line(b"shim 1\n");
        nccl.write_all(b"nccl 2\n").unwrap();
        ours.write_line(b"shim 2\n");
        assert_eq!(lines_of(&path), ["nccl 1", "shim 1", "nccl 2", "shim 2"]);
    }
}
