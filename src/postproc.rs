//! Post-processing (stub).
