//! TATP (placeholder: issue 5 replaces this file).
