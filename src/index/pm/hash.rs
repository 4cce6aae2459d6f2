//! The persistent hash index (being written; see the module documentation of `index::pm`).
