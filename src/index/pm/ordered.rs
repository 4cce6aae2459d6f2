//! The persistent ordered index (being written; see the module documentation of `index::pm`).
