//! Errors of the pure parsers (the planners' errors are `slot_plan::PlanError`).

/// A reply from Valkey (or a user-provided string) could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// A slot number or slot range is malformed or out of `0..16384`.
    #[error("invalid slot or slot range {0:?}")]
    InvalidSlot(String),
    /// A `CLUSTER NODES` line could not be parsed.
    #[error("invalid CLUSTER NODES line {line:?}: {reason}")]
    InvalidNodeLine {
        /// The offending line.
        line: String,
        /// What was wrong with it.
        reason: String,
    },
    /// A required field is missing from a reply.
    #[error("missing field {0:?}")]
    MissingField(String),
    /// A field has a value of the wrong shape.
    #[error("invalid value {value:?} for field {field:?}")]
    InvalidField {
        /// Field name.
        field: String,
        /// The value found.
        value: String,
    },
    /// A RESP reply has an unexpected structure.
    #[error("unexpected reply structure: {0}")]
    UnexpectedReply(String),
    /// A version string could not be parsed.
    #[error("invalid version {0:?}")]
    InvalidVersion(String),
}

impl ParseError {
    pub(crate) fn field(field: &str, value: impl Into<String>) -> Self {
        Self::InvalidField {
            field: field.to_owned(),
            value: value.into(),
        }
    }
}
