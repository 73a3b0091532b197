//! Message-level test helpers (todo).
