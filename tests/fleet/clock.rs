//! (filled by its issue-19 work package)
