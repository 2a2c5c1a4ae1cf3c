//! Helpers shared by the operator's integration tests.

/// `kubectl` arguments that wait (up to 60 s) until every CRD of the operator are Established.
pub const WAIT_CRDS_ESTABLISHED: [&str; 9] = [
    "wait",
    "--for",
    "condition=Established",
    "--timeout",
    "60s",
    "crd/valkeyclusters.valkey.io",
    "crd/valkeynodes.valkey.io",
    "crd/valkeybackups.valkey.io",
    "crd/valkeyscheduledbackups.valkey.io",
];
