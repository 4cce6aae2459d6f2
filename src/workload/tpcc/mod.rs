//! TPC-C (placeholder: issue 5 replaces this file).
