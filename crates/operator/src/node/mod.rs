//! ValkeyNode controller (in progress)
