//! Errors of the process-backed container runtime.

use std::path::PathBuf;

/// Everything that can go wrong while creating networks, sandboxes or containers.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A helper program (`ip`, `nsenter`, `mount`, ...) could not be started.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program that failed to start.
        program: String,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// A helper program ran but failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line (for humans).
        command: String,
        /// Exit status description.
        status: String,
        /// What the program printed on stderr.
        stderr: String,
    },
    /// A file system operation on a runtime-owned path failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was attempted (e.g. "create directory").
        action: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// The caller passed something the runtime cannot honour.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// Which input was invalid.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// Something with this name already exists (e.g. a bridge left by a crashed run).
    #[error("{0} already exists (run cleanup_leftovers / `localkube down` first)")]
    AlreadyExists(String),
    /// The pod CIDR has no free address left.
    #[error("no free address left in {0}")]
    AddressesExhausted(ipnet::Ipv4Net),
    /// An exec into a container did not finish in time.
    #[error("command did not finish within {0:?}")]
    ExecTimeout(std::time::Duration),
    /// A signal could not be delivered.
    #[error("cannot signal pid {pid}: {source}")]
    Signal {
        /// Target process.
        pid: i32,
        /// The errno.
        source: nix::Error,
    },
    /// The container already exited; it cannot be signalled or entered any more.
    #[error("container process {0} has already exited")]
    Exited(i32),
    /// A configuration file could not be parsed.
    #[error("cannot parse {path}: {reason}")]
    Config {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        reason: String,
    },
}

/// Result type of the runtime.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

impl RuntimeError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        RuntimeError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        RuntimeError::Invalid {
            what,
            reason: reason.into(),
        }
    }
}
