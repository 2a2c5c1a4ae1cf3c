//! localkube.
