//! Settings as the real NCCL sees them. NCCL reads each of its own (`NCCL_*`) from the
//! environment, which its first init completes from its configuration files without replacing
//! what is set (param.cc, `setenv(name, value, 0)`): the file `NCCL_CONF_FILE` names (NCCL 2.23
//! and later) or else `.nccl.conf` in the user's home, then `/etc/nccl.conf`; in each, a line
//! `NAME=value`, the first of a name taken. The shim reads the settings of NCCL's that it
//! follows (`NCCL_DEBUG`, `NCCL_P2P_DISABLE`, `NCCL_COMM_BLOCKING`, ...) and its own
//! (`NCCLSHIM_*`, which NCCL's init puts in the environment as well) the same way, whether or
//! not NCCL has loaded the files yet, and never writes the environment. (NCCL's environment
//! plugins, `NCCL_ENV_PLUGIN`, are not followed.)

use std::ffi::{CStr, CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, Ordering};

/// The value of NCCL's setting `name`: the environment's, else its configuration files'.
pub fn get(name: &str) -> Option<String> {
    get_os(name).map(|value| value.to_string_lossy().into_owned())
}

/// `get`, the bytes as they are (a path).
pub fn get_os(name: &str) -> Option<OsString> {
    if let Some(value) = std::env::var_os(name) {
        return Some(value);
    }
    from_files()
        .iter()
        .find(|(n, _)| n.as_bytes() == name.as_bytes())
        .map(|(_, value)| value.clone())
}

/// An integer setting as NCCL's `NCCL_PARAM` reads it (`strtoll`, any base C takes): `None`
/// where unset, empty, or out of range (NCCL's default then). As in C, a value with no digits
/// reads 0.
pub fn integer(name: &str) -> Option<i64> {
    c_integer(&get(name)?)
}

/// `value` as C's `strtoll` reads it, any base C takes (`None`: empty, or out of range).
pub(crate) fn c_integer(value: &str) -> Option<i64> {
    let value = CString::new(value).ok().filter(|v| !v.is_empty())?;
    // SAFETY: errno is this thread's; strtoll reads the NUL-terminated string and writes errno.
    unsafe {
        *libc::__errno_location() = 0;
        let read = libc::strtoll(value.as_ptr(), std::ptr::null_mut(), 0);
        (*libc::__errno_location() == 0).then_some(read)
    }
}

/// A setting NCCL caches (`NCCL_PARAM`), made of the settings `names`: read once, through
/// `cell`, or at each use where `NCCL_NO_CACHE` names one of them (`uncached`).
pub fn as_nccl_caches<T: Copy>(cell: &OnceLock<T>, names: &[&str], read: impl FnOnce() -> T) -> T {
    match names.iter().any(|name| uncached(name)) {
        true => read(),
        false => *cell.get_or_init(read),
    }
}

/// Whether NCCL reads its setting `name` again at each use rather than once: `NCCL_NO_CACHE`
/// (2.29.7 on) names it, or ALL (from 2.30.7 the names trimmed).
fn uncached(name: &str) -> bool {
    static LIST: OnceLock<Vec<String>> = OnceLock::new();
    if version().is_some_and(|code| code < NO_CACHE) {
        return false;
    }
    let list = LIST.get_or_init(|| {
        let value = get("NCCL_NO_CACHE").unwrap_or_default();
        names_of(&value, parsed()).map(String::from).collect()
    });
    list.iter().any(|n| n == "ALL" || n == name)
}

/// The names of a list NCCL splits at commas (`trimmed`: each trimmed of spaces, as its
/// parameter parsers do, `parsed`), empty ones dropped.
pub(crate) fn names_of(value: &str, trimmed: bool) -> impl Iterator<Item = &str> {
    let names = value.split(',').map(move |n| match trimmed {
        true => n.trim(),
        false => n,
    });
    names.filter(|n| !n.is_empty())
}

/// Whether the real NCCL reads its settings through its parameter parsers (2.30.7 on,
/// param/parser_*.h; an unknown version reads as the newest): a list's names and a level
/// trimmed of spaces, a value naming what NCCL does not know refused whole, a switch `1`, `T`
/// or `TRUE`.
pub(crate) fn parsed() -> bool {
    version().is_none_or(|code| code >= PARAM_PARSERS)
}

/// The first NCCL that reads its settings through its parameter parsers.
pub(crate) const PARAM_PARSERS: i32 = 23007;

/// The first NCCL that takes `NCCL_NO_CACHE`.
const NO_CACHE: i32 = 22907;

/// The real NCCL's version code, once known (`noted_version`); 0 before.
static VERSION: AtomicI32 = AtomicI32::new(0);

/// The real NCCL is version `code`: its rules for the files apply (called before anything of
/// NCCL's settings is read, where it can be).
pub fn noted_version(code: i32) {
    VERSION.store(code, Ordering::Relaxed);
}

/// The real NCCL's version code where `noted_version` has said it.
pub fn version() -> Option<i32> {
    Some(VERSION.load(Ordering::Relaxed)).filter(|&code| code != 0)
}

/// The first NCCL that takes `NCCL_CONF_FILE`.
const CONF_FILE_VARIABLE: i32 = 22300;
/// The first NCCL that finds the home through `HOME` (before, the user's entry in the password
/// database) and drops a line's `\r`.
const HOME_VARIABLE: i32 = 23003;

/// The settings NCCL's configuration files give, in NCCL's order, read once for each of the
/// three ways NCCL has read them (the real NCCL's, or the newest's before it is known).
fn from_files() -> &'static [(OsString, OsString)] {
    static READ: [OnceLock<Vec<(OsString, OsString)>>; 3] = [const { OnceLock::new() }; 3];
    let version = match VERSION.load(Ordering::Relaxed) {
        0 => i32::MAX,
        code => code,
    };
    let way = usize::from(version >= CONF_FILE_VARIABLE) + usize::from(version >= HOME_VARIABLE);
    READ[way].get_or_init(|| {
        let conf_file = std::env::var_os("NCCL_CONF_FILE").filter(|f| !f.is_empty());
        let home = || match version >= HOME_VARIABLE {
            true => std::env::var_os("HOME"),
            false => password_home(),
        };
        conf_files(version, conf_file.map(PathBuf::from), home)
            .iter()
            .filter_map(|path| std::fs::read(path).ok())
            .flat_map(|text| settings_of(&text, version >= HOME_VARIABLE))
            .collect()
    })
}

/// The files NCCL `version` reads, in order.
fn conf_files(
    version: i32,
    conf_file: Option<PathBuf>,
    home: impl FnOnce() -> Option<OsString>,
) -> Vec<PathBuf> {
    // As NCCL writes it, "%s/.nccl.conf": an empty home is the root's.
    let in_home = |home: OsString| {
        let mut path = home;
        path.push("/.nccl.conf");
        PathBuf::from(path)
    };
    let first = match conf_file.filter(|_| version >= CONF_FILE_VARIABLE) {
        Some(named) => Some(named),
        None => home().map(in_home),
    };
    first
        .into_iter()
        .chain([PathBuf::from("/etc/nccl.conf")])
        .collect()
}

/// The home directory of this process's user in the password database.
fn password_home() -> Option<OsString> {
    // SAFETY: `passwd` is plain data (integers and pointers), for which zeroes are valid.
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut space = vec![0 as libc::c_char; 16 << 10];
    loop {
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: getpwuid_r writes the entry and its strings into `entry` and `space` (whose
        // length it is given), and `found` to `&entry` or NULL.
        let status = unsafe {
            libc::getpwuid_r(
                libc::getuid(),
                &mut entry,
                space.as_mut_ptr(),
                space.len(),
                &mut found,
            )
        };
        // An entry larger than the room (a directory service's): more room, as getpwuid has.
        if status == libc::ERANGE && space.len() < 1 << 24 {
            space.resize(space.len() * 4, 0);
            continue;
        }
        if status != 0 || found.is_null() || entry.pw_dir.is_null() {
            return None;
        }
        // SAFETY: set by getpwuid_r to a NUL-terminated string inside `space`, alive here.
        let dir = unsafe { CStr::from_ptr(entry.pw_dir) };
        return Some(OsStr::from_bytes(dir.to_bytes()).to_os_string());
    }
}

/// Longest name and value NCCL keeps of a line (its buffers of 1024 bytes).
const MOST_BYTES: usize = 1023;

/// The `NAME=value` lines of a configuration file as NCCL sets them: split at the first `=`,
/// each part cut at 1023 bytes (and at a NUL, as C strings end), lines without `=` or starting
/// with `#` passed over; `drops_cr`: a line's `\r` before its end dropped too.
fn settings_of(text: &[u8], drops_cr: bool) -> Vec<(OsString, OsString)> {
    let c_string = |bytes: &[u8]| {
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        OsStr::from_bytes(&bytes[..end.min(MOST_BYTES)]).to_os_string()
    };
    text.split(|&b| b == b'\n')
        .map(|line| match drops_cr {
            true => line.strip_suffix(b"\r").unwrap_or(line),
            false => line,
        })
        .filter(|line| !line.starts_with(b"#"))
        .filter_map(|line| {
            let at = line.iter().position(|&b| b == b'=')?;
            let name = c_string(&line[..at]);
            // setenv refuses an empty name.
            (!name.is_empty()).then(|| (name, c_string(&line[at + 1..])))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_read_as_nccl_sets_them() {
        let text = b"NCCL_DEBUG=INFO\n# NCCL_P2P_DISABLE=1\nno equals sign\n=nameless\n\
                     NCCL_DEBUG=WARN\nNCCL_SOCKET_IFNAME= eth0=x \r\nNCCL_ALGO=Ring";
        let read = settings_of(text, true);
        let pairs: Vec<(&str, &str)> = read
            .iter()
            .map(|(n, v)| (n.to_str().unwrap(), v.to_str().unwrap()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("NCCL_DEBUG", "INFO"),
                ("NCCL_DEBUG", "WARN"),
                ("NCCL_SOCKET_IFNAME", " eth0=x "),
                ("NCCL_ALGO", "Ring"),
            ]
        );
        // Before 2.30.3 a `\r` stays in the value.
        let older = settings_of(b"NCCL_DEBUG=INFO\r\n", false);
        assert_eq!(older, [("NCCL_DEBUG".into(), "INFO\r".into())]);
        let long = settings_of(format!("N={}", "x".repeat(2000)).as_bytes(), true);
        assert_eq!(long[0].1.len(), MOST_BYTES);
        assert_eq!(settings_of(b"N=a\0b", true)[0].1, "a");
    }

    #[test]
    fn the_files_follow_the_real_nccls_version() {
        let named = || Some(PathBuf::from("/job/nccl.conf"));
        let home = || Some(OsString::from("/home/me"));
        let etc = PathBuf::from("/etc/nccl.conf");
        assert_eq!(
            conf_files(22809, named(), home),
            [PathBuf::from("/job/nccl.conf"), etc.clone()]
        );
        // Before 2.23, NCCL_CONF_FILE is not read.
        assert_eq!(
            conf_files(22107, named(), home),
            [PathBuf::from("/home/me/.nccl.conf"), etc.clone()]
        );
        assert_eq!(
            conf_files(22809, None, home),
            [PathBuf::from("/home/me/.nccl.conf"), etc.clone()]
        );
        assert_eq!(conf_files(22809, None, || None), vec![etc.clone()]);
        // An empty HOME (2.30.3 on) names the root's.
        let empty = || Some(OsString::new());
        assert_eq!(
            conf_files(23007, None, empty),
            [PathBuf::from("/.nccl.conf"), etc]
        );
    }

    #[test]
    fn lists_split_as_nccl_splits_them() {
        let names = |value, trimmed| names_of(value, trimmed).collect::<Vec<_>>();
        assert_eq!(names("NCCL_MAX_CTAS,ALL", false), ["NCCL_MAX_CTAS", "ALL"]);
        assert_eq!(names(" NCCL_MAX_CTAS,,", false), [" NCCL_MAX_CTAS"]);
        assert_eq!(names(" NCCL_MAX_CTAS, ALL", true), ["NCCL_MAX_CTAS", "ALL"]);
        assert!(names("", true).is_empty());
    }

    #[test]
    fn integers_read_as_strtoll_reads_them() {
        assert_eq!(c_integer("0"), Some(0));
        assert_eq!(c_integer(" 1"), Some(1));
        assert_eq!(c_integer("0x10"), Some(16));
        assert_eq!(c_integer("010"), Some(8));
        assert_eq!(c_integer("1abc"), Some(1));
        assert_eq!(c_integer("abc"), Some(0));
        assert_eq!(c_integer(""), None);
        assert_eq!(c_integer("99999999999999999999"), None);
    }

    #[test]
    fn the_home_is_the_password_databases() {
        // Some user entry exists wherever the tests run (root in CI).
        let home = password_home().expect("this user's entry");
        assert!(std::path::Path::new(&home).is_absolute(), "{home:?}");
    }
}
