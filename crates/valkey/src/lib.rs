//! Valkey operations layer.
