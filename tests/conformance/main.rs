//! Conformance suite.
