//! Workload definitions (YCSB core workloads A–F and custom mixes) and the operation
//! generator.

use std::sync::Arc;

use rand::Rng;
use serde::{Deserialize, Serialize};

use super::generators::{
    AcknowledgedCounter, UniformGenerator, ZipfianGenerator, ZIPFIAN_CONSTANT,
};
use super::keys::{build_key, Distribution, KeyChooser};
use super::YcsbError;

/// Names accepted by [`Workload::from_name`] (case-insensitive; `workloada` etc. too).
pub const WORKLOAD_NAMES: &[&str] = &[
    "a",
    "b",
    "c",
    "d",
    "e",
    "f",
    "read-only",
    "read-heavy",
    "balanced",
    "write-heavy",
];

/// YCSB `scanlengthdistribution`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScanLengthDistribution {
    /// Uniform over `[min_scan_length, max_scan_length]` (YCSB default).
    Uniform,
    /// Zipfian over the same range, short scans most likely.
    Zipfian,
}

/// A YCSB workload: operation mix, request distribution and record shape.
///
/// Reads and scans always read all fields (YCSB's `readallfields=true` default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// Name for reports (`"a"`, `"read-heavy"`, `"custom"`, ...).
    pub name: String,
    /// Fraction of reads.
    pub read_proportion: f64,
    /// Fraction of updates.
    pub update_proportion: f64,
    /// Fraction of inserts (new records).
    pub insert_proportion: f64,
    /// Fraction of scans.
    pub scan_proportion: f64,
    /// Fraction of read-modify-writes.
    pub read_modify_write_proportion: f64,
    /// Which records reads, updates, scans and read-modify-writes go to.
    pub request_distribution: Distribution,
    /// Shortest scan, in records (YCSB `minscanlength`, default 1).
    pub min_scan_length: u64,
    /// Longest scan, in records (YCSB `maxscanlength`, default 100).
    pub max_scan_length: u64,
    /// Distribution of scan lengths.
    pub scan_length_distribution: ScanLengthDistribution,
    /// Fields per record (YCSB `fieldcount`, default 10).
    pub field_count: u32,
    /// Bytes per field (YCSB `fieldlength`, default 100).
    pub field_len: usize,
    /// Updates write every field (YCSB `writeallfields`, default false: one random field).
    pub write_all_fields: bool,
    /// Operations per transaction (1 is plain YCSB; Zen/FIR-style runs use 16).
    pub ops_per_txn: usize,
    /// How fields are stored: fixed `Bytes(field_len)` columns written as raw bytes (the
    /// default), or `Text(field_len)` strings through the typed API (issue 21).
    #[serde(default)]
    pub value_type: super::driver::ValueType,
}

impl Workload {
    fn base(name: &str, read: f64, update: f64, insert: f64, scan: f64, rmw: f64) -> Self {
        Self {
            name: name.to_owned(),
            read_proportion: read,
            update_proportion: update,
            insert_proportion: insert,
            scan_proportion: scan,
            read_modify_write_proportion: rmw,
            request_distribution: Distribution::Zipfian {
                theta: ZIPFIAN_CONSTANT,
            },
            min_scan_length: 1,
            max_scan_length: 100,
            scan_length_distribution: ScanLengthDistribution::Uniform,
            field_count: 10,
            field_len: 100,
            write_all_fields: false,
            ops_per_txn: 1,
            value_type: super::driver::ValueType::Bytes,
        }
    }

    /// Workload A, update heavy: 50% reads, 50% updates, zipfian.
    pub fn a() -> Self {
        Self::base("a", 0.5, 0.5, 0.0, 0.0, 0.0)
    }

    /// Workload B, read mostly: 95% reads, 5% updates, zipfian.
    pub fn b() -> Self {
        Self::base("b", 0.95, 0.05, 0.0, 0.0, 0.0)
    }

    /// Workload C, read only: 100% reads, zipfian.
    pub fn c() -> Self {
        Self::base("c", 1.0, 0.0, 0.0, 0.0, 0.0)
    }

    /// Workload D, read latest: 95% reads, 5% inserts, latest distribution.
    pub fn d() -> Self {
        Self {
            request_distribution: Distribution::Latest,
            ..Self::base("d", 0.95, 0.0, 0.05, 0.0, 0.0)
        }
    }

    /// Workload E, short ranges: 95% scans (uniform 1..=100 records), 5% inserts, zipfian.
    pub fn e() -> Self {
        Self::base("e", 0.0, 0.0, 0.05, 0.95, 0.0)
    }

    /// Workload F, read-modify-write: 50% reads, 50% read-modify-writes, zipfian.
    pub fn f() -> Self {
        Self::base("f", 0.5, 0.0, 0.0, 0.0, 0.5)
    }

    /// Zen §4.1 read-only mix: 100% reads, zipfian.
    pub fn read_only() -> Self {
        Self::base("read-only", 1.0, 0.0, 0.0, 0.0, 0.0)
    }

    /// Zen §4.1 read-heavy mix: 90% reads, 10% updates, zipfian.
    pub fn read_heavy() -> Self {
        Self::base("read-heavy", 0.9, 0.1, 0.0, 0.0, 0.0)
    }

    /// Zen §4.1 balanced mix: 50% reads, 50% updates, zipfian.
    pub fn balanced() -> Self {
        Self::base("balanced", 0.5, 0.5, 0.0, 0.0, 0.0)
    }

    /// Zen §4.1 write-heavy mix: 10% reads, 90% updates, zipfian.
    pub fn write_heavy() -> Self {
        Self::base("write-heavy", 0.1, 0.9, 0.0, 0.0, 0.0)
    }

    /// Looks a preset up by name: `a`..`f` (also `workloada`..), `read-only`,
    /// `read-heavy`, `balanced`, `write-heavy`; case-insensitive.
    pub fn from_name(name: &str) -> Result<Self, YcsbError> {
        let lower = name.trim().to_ascii_lowercase();
        let short = lower.strip_prefix("workload").unwrap_or(&lower);
        Ok(match short {
            "a" => Self::a(),
            "b" => Self::b(),
            "c" => Self::c(),
            "d" => Self::d(),
            "e" => Self::e(),
            "f" => Self::f(),
            "read-only" => Self::read_only(),
            "read-heavy" => Self::read_heavy(),
            "balanced" => Self::balanced(),
            "write-heavy" => Self::write_heavy(),
            _ => {
                return Err(YcsbError::UnknownWorkload {
                    name: name.to_owned(),
                    valid: WORKLOAD_NAMES.join(", "),
                })
            }
        })
    }

    /// A custom mix with YCSB defaults otherwise (zipfian 0.99, 10 × 100-byte fields).
    /// Proportions must be non-negative and sum to 1 (within 1e-9).
    pub fn custom(
        read: f64,
        update: f64,
        insert: f64,
        scan: f64,
        rmw: f64,
    ) -> Result<Self, YcsbError> {
        let w = Self::base("custom", read, update, insert, scan, rmw);
        w.validate()?;
        Ok(w)
    }

    /// Sets the zipfian constant of a zipfian request distribution (0 <= theta < 1; 0
    /// gives uniform). Errors for "latest" (fixed at 0.99, as YCSB) and "uniform".
    pub fn with_theta(mut self, theta: f64) -> Result<Self, YcsbError> {
        match self.request_distribution {
            Distribution::Zipfian { .. } => {
                if !(theta.is_finite() && (0.0..1.0).contains(&theta)) {
                    return Err(YcsbError::InvalidTheta(theta));
                }
                self.request_distribution = Distribution::Zipfian { theta };
                Ok(self)
            }
            _ => Err(YcsbError::InvalidParameter(
                "theta only applies to a zipfian request distribution",
            )),
        }
    }

    /// Sets the operations per transaction.
    pub fn with_ops_per_txn(mut self, ops_per_txn: usize) -> Self {
        self.ops_per_txn = ops_per_txn;
        self
    }

    fn proportions(&self) -> [(&'static str, f64); 5] {
        [
            ("read", self.read_proportion),
            ("update", self.update_proportion),
            ("insert", self.insert_proportion),
            ("scan", self.scan_proportion),
            ("read-modify-write", self.read_modify_write_proportion),
        ]
    }

    /// Checks proportions and parameters (fields are public, so [`OpGenerator::new`]
    /// calls this again).
    pub fn validate(&self) -> Result<(), YcsbError> {
        let mut sum = 0.0;
        for (name, value) in self.proportions() {
            if !(value.is_finite() && value >= 0.0) {
                return Err(YcsbError::InvalidProportion { name, value });
            }
            sum += value;
        }
        if (sum - 1.0).abs() > 1e-9 {
            return Err(YcsbError::ProportionSum(sum));
        }
        if self.field_count == 0 {
            return Err(YcsbError::InvalidParameter("field_count must be >= 1"));
        }
        if self.field_len == 0 {
            return Err(YcsbError::InvalidParameter("field_len must be >= 1"));
        }
        if self.ops_per_txn == 0 {
            return Err(YcsbError::InvalidParameter("ops_per_txn must be >= 1"));
        }
        if self.min_scan_length == 0 || self.min_scan_length > self.max_scan_length {
            return Err(YcsbError::InvalidParameter(
                "need 1 <= min_scan_length <= max_scan_length",
            ));
        }
        Ok(())
    }
}

/// One YCSB operation. Keys are engine keys ([`build_key`] of a record number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Op {
    /// Read all fields of a record.
    Read {
        /// Engine key.
        key: u64,
    },
    /// Overwrite one field (`Some`) or all fields (`None`, `write_all_fields`).
    Update {
        /// Engine key.
        key: u64,
        /// Field index in `[0, field_count)`, or `None` for every field.
        field: Option<u32>,
    },
    /// Insert a new record with all fields. Once it commits, the driver acknowledges
    /// `key_to_record(key)` on the shared [`AcknowledgedCounter`].
    Insert {
        /// Engine key.
        key: u64,
    },
    /// Read `len` records in engine-key order starting at `start_key` (all fields).
    Scan {
        /// Engine key of an existing record.
        start_key: u64,
        /// Number of records.
        len: u64,
    },
    /// Read all fields of a record, then update one field (`Some`) or all (`None`).
    ReadModifyWrite {
        /// Engine key.
        key: u64,
        /// Field index written, or `None` for every field.
        field: Option<u32>,
    },
}

impl Op {
    /// The key the operation targets (start key for a scan).
    pub fn key(&self) -> u64 {
        match *self {
            Op::Read { key }
            | Op::Update { key, .. }
            | Op::Insert { key }
            | Op::ReadModifyWrite { key, .. } => key,
            Op::Scan { start_key, .. } => start_key,
        }
    }

    /// Whether the operation writes.
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            Op::Update { .. } | Op::Insert { .. } | Op::ReadModifyWrite { .. }
        )
    }
}

#[derive(Debug, Clone)]
enum ScanLength {
    Uniform(UniformGenerator),
    Zipfian(ZipfianGenerator),
}

/// Turns a [`Workload`] into [`Op`]s; one per client thread, sharing the insert counter.
///
/// Reads, updates, scans and read-modify-writes pick among the records acknowledged so
/// far (`inserts.acknowledged_count()`), so with inserts (D, E) the key range grows, and
/// under "latest" the newest acknowledged record is the hottest.
#[derive(Debug, Clone)]
pub struct OpGenerator {
    workload: Workload,
    keys: KeyChooser,
    inserts: Arc<AcknowledgedCounter>,
    /// Cumulative proportions: read, update, insert, scan, read-modify-write.
    cumulative: [f64; 5],
    /// Index of the last op kind with a non-zero share, taken when rounding leaves
    /// the draw past the final bound.
    last_kind: usize,
    scan_len: ScanLength,
}

impl OpGenerator {
    /// A generator over `record_count` loaded records. `inserts` must have been created
    /// with `AcknowledgedCounter::new(record_count)` (or have grown since).
    pub fn new(
        workload: Workload,
        record_count: u64,
        inserts: Arc<AcknowledgedCounter>,
    ) -> Result<Self, YcsbError> {
        workload.validate()?;
        if inserts.acknowledged_count() < record_count {
            return Err(YcsbError::InvalidParameter(
                "insert counter is behind record_count",
            ));
        }
        let keys = KeyChooser::new(workload.request_distribution, record_count)?;
        let mut cumulative = [0.0; 5];
        let mut acc = 0.0;
        let mut last_kind = 0;
        for (i, (_, p)) in workload.proportions().into_iter().enumerate() {
            acc += p;
            cumulative[i] = acc;
            if p > 0.0 {
                last_kind = i;
            }
        }
        let (lo, hi) = (workload.min_scan_length, workload.max_scan_length);
        let scan_len = match workload.scan_length_distribution {
            ScanLengthDistribution::Uniform => ScanLength::Uniform(UniformGenerator::new(lo, hi)?),
            ScanLengthDistribution::Zipfian => {
                ScanLength::Zipfian(ZipfianGenerator::new(lo, hi - lo + 1)?)
            }
        };
        Ok(Self {
            workload,
            keys,
            inserts,
            cumulative,
            last_kind,
            scan_len,
        })
    }

    /// The workload being generated.
    pub fn workload(&self) -> &Workload {
        &self.workload
    }

    /// The shared insert counter.
    pub fn inserts(&self) -> &Arc<AcknowledgedCounter> {
        &self.inserts
    }

    fn existing_key<R: Rng + ?Sized>(&mut self, rng: &mut R) -> u64 {
        let count = self.inserts.acknowledged_count();
        build_key(self.keys.next_key_below(rng, count))
    }

    fn write_field<R: Rng + ?Sized>(&self, rng: &mut R) -> Option<u32> {
        if self.workload.write_all_fields {
            None
        } else {
            Some(rng.gen_range(0..self.workload.field_count))
        }
    }

    /// The next operation.
    pub fn next_op<R: Rng + ?Sized>(&mut self, rng: &mut R) -> Op {
        let u: f64 = rng.gen();
        let kind = self
            .cumulative
            .iter()
            .position(|&c| u < c)
            .unwrap_or(self.last_kind);
        match kind {
            0 => Op::Read {
                key: self.existing_key(rng),
            },
            1 => {
                let key = self.existing_key(rng);
                Op::Update {
                    key,
                    field: self.write_field(rng),
                }
            }
            2 => Op::Insert {
                key: build_key(self.inserts.next_insert_key()),
            },
            3 => {
                let start_key = self.existing_key(rng);
                let len = match &mut self.scan_len {
                    ScanLength::Uniform(g) => g.next(rng),
                    ScanLength::Zipfian(g) => g.next(rng),
                };
                Op::Scan { start_key, len }
            }
            _ => {
                let key = self.existing_key(rng);
                Op::ReadModifyWrite {
                    key,
                    field: self.write_field(rng),
                }
            }
        }
    }

    /// Clears `ops` and fills it with one transaction's `ops_per_txn` operations. Keys
    /// may repeat within a transaction, as in independent YCSB requests.
    pub fn next_txn<R: Rng + ?Sized>(&mut self, rng: &mut R, ops: &mut Vec<Op>) {
        ops.clear();
        for _ in 0..self.workload.ops_per_txn {
            let op = self.next_op(rng);
            ops.push(op);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::ycsb::key_to_record;
    use rand::rngs::StdRng;
    use rand::SeedableRng;
    use std::collections::HashSet;

    const RECORDS: u64 = 10_000;

    fn generator(w: Workload) -> OpGenerator {
        OpGenerator::new(w, RECORDS, Arc::new(AcknowledgedCounter::new(RECORDS))).unwrap()
    }

    #[test]
    fn presets_match_ycsb_files() {
        let zipf = Distribution::Zipfian { theta: 0.99 };
        let table = [
            ("a", [0.5, 0.5, 0.0, 0.0, 0.0], zipf),
            ("b", [0.95, 0.05, 0.0, 0.0, 0.0], zipf),
            ("c", [1.0, 0.0, 0.0, 0.0, 0.0], zipf),
            ("d", [0.95, 0.0, 0.05, 0.0, 0.0], Distribution::Latest),
            ("e", [0.0, 0.0, 0.05, 0.95, 0.0], zipf),
            ("f", [0.5, 0.0, 0.0, 0.0, 0.5], zipf),
        ];
        for (name, props, dist) in table {
            let w = Workload::from_name(name).unwrap();
            let got: Vec<f64> = w.proportions().iter().map(|p| p.1).collect();
            assert_eq!(got, props, "{name}");
            assert_eq!(w.request_distribution, dist, "{name}");
            assert_eq!((w.field_count, w.field_len, w.ops_per_txn), (10, 100, 1));
            assert_eq!((w.min_scan_length, w.max_scan_length), (1, 100));
            assert_eq!(w.scan_length_distribution, ScanLengthDistribution::Uniform);
            assert!(!w.write_all_fields);
            w.validate().unwrap();
        }
        assert_eq!(Workload::from_name("A").unwrap(), Workload::a());
        assert_eq!(Workload::from_name(" workloadE ").unwrap(), Workload::e());
        assert_eq!(
            Workload::from_name("Read-Heavy").unwrap(),
            Workload::read_heavy()
        );
    }

    #[test]
    fn unknown_workload_lists_valid_names() {
        let err = Workload::from_name("g").unwrap_err();
        assert!(matches!(&err, YcsbError::UnknownWorkload { name, .. } if name == "g"));
        let msg = err.to_string();
        for n in WORKLOAD_NAMES {
            assert!(msg.contains(n), "{msg}");
        }
        assert!(Workload::from_name("").is_err());
        assert!(Workload::from_name("workload").is_err());
    }

    #[test]
    fn observed_mix_matches_presets() {
        const OPS: usize = 100_000;
        for name in ["a", "b", "c", "d", "e", "f"] {
            let w = Workload::from_name(name).unwrap();
            let expect: Vec<f64> = w.proportions().iter().map(|p| p.1).collect();
            let mut gen = generator(w);
            let mut rng = StdRng::seed_from_u64(100);
            let mut counts = [0usize; 5];
            let mut inserted = HashSet::new();
            for _ in 0..OPS {
                let op = gen.next_op(&mut rng);
                let live = gen.inserts().acknowledged_count();
                let kind = match op {
                    Op::Read { .. } => 0,
                    Op::Update { field, .. } => {
                        assert!(field.unwrap() < 10);
                        1
                    }
                    Op::Insert { key } => {
                        let rec = key_to_record(key);
                        assert_eq!(rec, live, "inserts are handed out in order");
                        assert!(inserted.insert(rec));
                        gen.inserts().acknowledge(rec).unwrap();
                        2
                    }
                    Op::Scan { len, .. } => {
                        assert!((1..=100).contains(&len));
                        3
                    }
                    Op::ReadModifyWrite { field, .. } => {
                        assert!(field.unwrap() < 10);
                        4
                    }
                };
                if kind != 2 {
                    assert!(
                        key_to_record(op.key()) < live,
                        "{name}: key beyond acknowledged records"
                    );
                }
                counts[kind] += 1;
            }
            for i in 0..5 {
                let got = counts[i] as f64 / OPS as f64;
                assert!(
                    (got - expect[i]).abs() < 0.01,
                    "{name} kind {i}: {got} vs {}",
                    expect[i]
                );
            }
            assert_eq!(
                gen.inserts().acknowledged_count(),
                RECORDS + counts[2] as u64
            );
        }
    }

    #[test]
    fn latest_reads_follow_inserts() {
        let mut gen = generator(Workload::d());
        let mut rng = StdRng::seed_from_u64(12);
        let mut newest_hits = 0;
        let mut reads = 0;
        for _ in 0..20_000 {
            match gen.next_op(&mut rng) {
                Op::Insert { key } => gen.inserts().acknowledge(key_to_record(key)).unwrap(),
                Op::Read { key } => {
                    reads += 1;
                    let newest = gen.inserts().last_acknowledged().unwrap();
                    newest_hits += usize::from(key_to_record(key) == newest);
                }
                op => panic!("unexpected {op:?}"),
            }
        }
        // The newest record gets the zipfian head, ~1/zeta(n, 0.99) ≈ 10% here.
        let share = newest_hits as f64 / reads as f64;
        assert!(share > 0.08 && share < 0.13, "{share}");
    }

    #[test]
    fn custom_mixes_validate() {
        let w = Workload::custom(0.9, 0.1, 0.0, 0.0, 0.0).unwrap();
        assert_eq!(w.name, "custom");
        assert!(Workload::custom(0.5, 0.5 + 1e-12, 0.0, 0.0, 0.0).is_ok());
        assert!(matches!(
            Workload::custom(0.9, 0.0, 0.0, 0.0, 0.0),
            Err(YcsbError::ProportionSum(_))
        ));
        assert!(matches!(
            Workload::custom(1.1, -0.1, 0.0, 0.0, 0.0),
            Err(YcsbError::InvalidProportion { name: "update", .. })
        ));
        assert!(Workload::custom(f64::NAN, 1.0, 0.0, 0.0, 0.0).is_err());
        for (w, r) in [
            (Workload::read_only(), 1.0),
            (Workload::read_heavy(), 0.9),
            (Workload::balanced(), 0.5),
            (Workload::write_heavy(), 0.1),
        ] {
            assert_eq!(w.read_proportion, r);
            assert!((w.update_proportion - (1.0 - r)).abs() < 1e-12);
            w.validate().unwrap();
        }
        let bad = Workload {
            field_count: 0,
            ..Workload::a()
        };
        assert!(OpGenerator::new(bad, 10, Arc::new(AcknowledgedCounter::new(10))).is_err());
        let bad = Workload {
            min_scan_length: 5,
            max_scan_length: 4,
            ..Workload::e()
        };
        assert!(bad.validate().is_err());
        assert!(Workload::a().with_ops_per_txn(0).validate().is_err());
    }

    #[test]
    fn theta_override() {
        let w = Workload::balanced().with_theta(0.5).unwrap();
        assert_eq!(w.request_distribution, Distribution::Zipfian { theta: 0.5 });
        assert!(Workload::a().with_theta(0.0).is_ok());
        assert!(matches!(
            Workload::a().with_theta(1.0),
            Err(YcsbError::InvalidTheta(_))
        ));
        assert!(Workload::d().with_theta(0.5).is_err());
        let mut gen = generator(Workload::a().with_theta(0.0).unwrap());
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..1000 {
            assert!(key_to_record(gen.next_op(&mut rng).key()) < RECORDS);
        }
    }

    #[test]
    fn generator_rejects_bad_setup() {
        assert!(OpGenerator::new(Workload::a(), 0, Arc::new(AcknowledgedCounter::new(0))).is_err());
        assert!(
            OpGenerator::new(Workload::a(), 100, Arc::new(AcknowledgedCounter::new(50))).is_err()
        );
    }

    #[test]
    fn txn_fill_and_write_all_fields() {
        let w = Workload {
            write_all_fields: true,
            ..Workload::write_heavy()
        }
        .with_ops_per_txn(16);
        let mut gen = generator(w);
        let mut rng = StdRng::seed_from_u64(3);
        let mut ops = vec![Op::Insert { key: 0 }; 40];
        let mut updates = 0;
        for _ in 0..100 {
            gen.next_txn(&mut rng, &mut ops);
            assert_eq!(ops.len(), 16);
            for op in &ops {
                match op {
                    Op::Update { field, .. } => {
                        assert_eq!(*field, None);
                        updates += 1;
                    }
                    Op::Read { .. } => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        assert!(updates > 1300, "{updates}");
    }

    #[test]
    fn same_seed_same_ops() {
        let run = |seed: u64| {
            let mut gen = generator(Workload::e().with_ops_per_txn(4));
            let mut rng = StdRng::seed_from_u64(seed);
            let mut all = Vec::new();
            let mut ops = Vec::new();
            for _ in 0..2000 {
                gen.next_txn(&mut rng, &mut ops);
                for op in &ops {
                    if let Op::Insert { key } = op {
                        gen.inserts().acknowledge(key_to_record(*key)).unwrap();
                    }
                }
                all.extend_from_slice(&ops);
            }
            all
        };
        let a = run(77);
        assert_eq!(a.len(), 8000);
        assert_eq!(a, run(77));
        assert_ne!(a, run(78));
    }
}
