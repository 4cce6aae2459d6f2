//! Workloads: key and operation generators and, later, the drivers that run them against an engine.

pub mod bank;
pub mod ptm_hash;
pub mod ptm_kv;
pub mod ptm_neworder;
pub mod ptm_tatp;
pub mod ptm_tree;
pub mod tatp;
pub mod tpcc;
pub mod ycsb;
