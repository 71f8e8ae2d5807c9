//! procfs backend.
