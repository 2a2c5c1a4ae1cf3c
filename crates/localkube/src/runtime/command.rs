//! Running host helper programs (`ip`, `umount`, ...) synchronously, with their stderr in errors.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use super::error::{Result, RuntimeError};

/// Runs `program args...`, returning its stdout, or an error carrying its stderr.
pub(crate) fn run<S: AsRef<str>>(program: &str, args: &[S]) -> Result<String> {
    let output = Command::new(program)
        .args(args.iter().map(AsRef::as_ref))
        .stdin(Stdio::null())
        .output()
        .map_err(|source| RuntimeError::Spawn {
            program: program.to_string(),
            source,
        })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(RuntimeError::Command {
            command: command_line(program, args),
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        })
    }
}

/// Runs `ip args...`.
pub(crate) fn ip<S: AsRef<str>>(args: &[S]) -> Result<String> {
    run("ip", args)
}

/// Like [`ip`], but only logs a failure (for best-effort cleanup).
pub(crate) fn ip_quiet<S: AsRef<str>>(args: &[S]) -> bool {
    match ip(args) {
        Ok(_) => true,
        Err(e) => {
            tracing::debug!(error = %e, "ignored ip failure during cleanup");
            false
        }
    }
}

/// `nsenter`'s absolute path, looked up once on this process's `PATH` (its bare name if it
/// is not there: spawning then fails with a clear error).
///
/// Container starts and execs run `nsenter` with an environment of their own (`PATH`
/// included). The standard library spawns such a command by its bare name with `fork`, which
/// copies this large, multi-threaded process's page tables and stalls its threads; named by
/// path it uses `posix_spawn` (`vfork`-like: no copy).
pub(crate) fn nsenter() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| which::which("nsenter").unwrap_or_else(|_| PathBuf::from("nsenter")))
}

fn command_line<S: AsRef<str>>(program: &str, args: &[S]) -> String {
    let mut s = program.to_string();
    for a in args {
        s.push(' ');
        s.push_str(a.as_ref());
    }
    s
}

/// Quotes `s` for a POSIX shell: the result is one word whose value is exactly `s`.
pub(crate) fn shell_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nsenter_is_found_by_absolute_path() {
        let p = nsenter();
        assert!(p.is_absolute(), "{}", p.display());
        assert!(p.ends_with("nsenter"));
    }

    #[test]
    fn shell_quote_round_trips_through_sh() {
        for s in [
            "plain",
            "",
            "with space",
            "it's",
            "$(echo no)",
            "`x`",
            "a\"b\\c",
            "\n;|&*?",
        ] {
            let out = std::process::Command::new("/bin/sh")
                .arg("-c")
                .arg(format!("printf %s {}", shell_quote(s)))
                .output()
                .expect("sh runs");
            assert_eq!(String::from_utf8_lossy(&out.stdout), s);
        }
    }
}
