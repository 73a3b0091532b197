//! The collection loop (stub).
