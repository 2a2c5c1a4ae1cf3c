//! ValkeyCluster / ValkeyNode API.
