//! Integration scenarios live in tests/.
