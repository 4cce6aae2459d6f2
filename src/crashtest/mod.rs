//! Crash-consistency harness (placeholder: issue 4 replaces this file).
