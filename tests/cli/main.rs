//! CLI tests.
